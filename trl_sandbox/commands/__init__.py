"""What a person runs: the ``trl-sandbox`` command line and ``python -m trl_sandbox.train``.

``cli`` (``exec``, ``batch``, ``evaluate``, ``ls``, ``reap``, ``train``), ``train`` (the training
entry point ``accelerate launch`` starts), ``evaluate``, ``batch``, and their files and output:
``results_file``, ``run_dir``, ``progress``, ``plotting``.

Imports: anything in the package; nothing imports it (but the ``trl_sandbox.train`` shim).
"""
