"""Task sets: turn a completion into a ``Program`` and an execution into an ``Outcome``.

A task set (registered through ``trl_sandbox_register_tasks``) lists dataset rows and scores
completions for them. The contract (``Program``, ``Outcome``, ``Task``) lives in
``trl_sandbox.sandbox``; here are the task sets and their parts: ``generic`` (a dataset's own test
columns: asserts, calls or stdin/stdout cases), ``builtin`` (the built-in task set), ``call`` and
``check`` (the two ways ``generic`` judges), ``extract`` (the code in a completion), ``resolve``
(which task scores a row) and ``load`` (``load_tasks``: a task set's rows as a dataset).

Imports: ``trl_sandbox.sandbox``, ``trl_sandbox.plugins``, ``trl_sandbox.judge`` and
``trl_sandbox.pool``.
"""
