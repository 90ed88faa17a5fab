"""``python -m trl_sandbox.train`` (what ``accelerate launch`` runs): the training entry point,
``trl_sandbox.commands.train``, under the name users and launch scripts know."""

import sys

from trl_sandbox.commands.train import main

if __name__ == "__main__":
    sys.exit(main())
