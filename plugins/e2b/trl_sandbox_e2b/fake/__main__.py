"""``python -m trl_sandbox_e2b.fake --port 0``: a fake E2B on 127.0.0.1 for trying the provider offline.

The first line printed is ``PORT=<n>``, the second a JSON object of the variables that point the
``e2b`` SDK (and so the ``e2b`` provider) at it. It serves until SIGTERM or SIGINT, then kills every
fake sandbox (and every process in them) before it exits.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from . import FakeE2B


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trl_sandbox_e2b.fake", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--page-size", type=int, default=100, help="sandboxes per page of a list")
    args = parser.parse_args(argv)
    fake = FakeE2B(port=args.port, page_size=args.page_size).start()
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    print(f"PORT={fake.server.server_address[1]}", flush=True)
    print(json.dumps(fake.env()), flush=True)
    try:
        done.wait()
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
