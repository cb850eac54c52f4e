"""``python -m lace.agent``: run the node agent (inside the node's network namespace)."""

from __future__ import annotations

import argparse
import logging
import sys

from .daemon import Agent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lace-agent", description="lace node agent")
    ap.add_argument("--node", required=True)
    ap.add_argument("--store", required=True, help="path of the embedded store")
    ap.add_argument("--pin-root", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--uplink", default="eth0")
    ap.add_argument("--mtu", type=int, default=1460, help="pod MTU (underlay MTU - 40)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    agent = Agent(node=args.node, store_path=args.store, pin_root=args.pin_root,
                  socket_path=args.socket, uplink=args.uplink, mtu=args.mtu)
    try:
        agent.run_forever()
    except Exception as e:
        logging.getLogger("lace.agent").error("agent failed: %s: %s", type(e).__name__, e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
