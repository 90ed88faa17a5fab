"""Clean leases on remote sandboxes (Daytona, CoreWeave and any plugin that runs commands in a
container that outlives one program).

``lease``: the per-sandbox state a remote provider keeps and the argv of each program;
``launcher``: the standard-library program sent with every exec, which cleans the sandbox and
runs the program in a namespace that ends with it; ``fake_container``: a bubblewrap container per
fake sandbox, so that tests of remote plugins see leftovers, ``/tmp`` and processes as the service
does.

Imports: ``trl_sandbox.sandbox`` only.
"""
