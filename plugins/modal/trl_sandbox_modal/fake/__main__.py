"""``python -m trl_sandbox_modal.fake --port 0``: a fake Modal service for trying the provider offline.

Prints ``PORT=<n>`` on the first line and, on the second, one JSON object of the environment
variables that point the ``modal`` SDK at it; serves until SIGTERM or SIGINT, then ends every
sandbox and removes its temporary config file, leaving nothing behind.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from . import FakeModal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trl_sandbox_modal.fake", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free one)")
    args = parser.parse_args(argv)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    fake = FakeModal(port=args.port).start()
    try:
        print(f"PORT={fake.port}", flush=True)
        print(json.dumps(fake.env()), flush=True)
        done.wait()
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
