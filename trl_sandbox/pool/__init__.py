"""The sandbox pool: leases, healing, teardown, and the limits around them.

``sandbox_pool.SandboxPool`` owns every sandbox of a run: it creates them through a provider,
lends them one lease at a time, resets them between leases, replaces the ones that die, tags
them with the run's metadata (``tags``), and deletes every one of them at the end (``close``).
``heal``, ``idle_queue``, ``host_limit``, ``settings`` and ``loop`` (the pool's event-loop
thread) are its parts.

Imports: ``trl_sandbox.sandbox`` and ``trl_sandbox.plugins`` (to make a provider); never the
tasks, scoring or training above it.
"""
