"""The supervisor of a local sandbox: PID 1 inside the bubblewrap container.

These modules run *inside* the sandbox with the sandbox's interpreter (standard library only,
Python 3.8+). They are shipped in read-only at ``/.trl-sandbox/_trl_sandbox_supervisor/`` (a name
no program's own module will shadow) and started by ``/.trl-sandbox/supervisor.py``; that
directory leaves ``sys.path`` before any program runs. The host imports ``protocol`` from here
for the wire format, and nothing else.

* ``protocol``: the wire format and the channel to the host.
* ``state``: the configuration and the few pieces of state the other modules share.
* ``kernel``: what makes every program start from a clean kernel: no capabilities, a seccomp
  filter, and its own IPC namespace or no IPC objects at all; and the fresh tmpfs mounts of every
  lease.
* ``forkserver``: the exec path in the supervisor (plan, compile, fork, wait, sweep).
* ``budget``: an exec's time budget (its process tree's CPU, the wall-clock backstop).
* ``output``: an exec's output, from its pipes to the host without passing through memory.
* ``child``: the exec path in the forked child (become the program).
* ``resident``: the judge that stays resident across programs (one fork per judged program).
* ``files``: the host's file operations and ``reset()``.
* ``main``: start-up, configuration and the request loop.
"""
