"""``python -m lace.controllers --store SPEC``: run lace's controllers until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from lace.store.errors import StoreError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lace-controllers", description=__doc__)
    ap.add_argument("--store", required=True,
                    help="the store: a file (a lab's <state>/store.db) or etcd://HOST:PORT[,...][/PREFIX][?netns=NAME]")
    ap.add_argument("--resync", type=float, default=30.0, help="seconds between full resyncs (default 30)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from lace.store.config import PLATFORM_KUBERNETES, StoreConfig, open_store

    from .controller import EndpointSliceController
    try:
        config = StoreConfig.parse(args.store)
        if config.platform == PLATFORM_KUBERNETES:
            # on a cluster the controller manager writes EndpointSlices; a second writer would fight it
            raise StoreError(f"lace's EndpointSlice controller runs only in the lab, not on {config.describe()}",
                             hint="Kubernetes' controller manager maintains EndpointSlices there")
        store = open_store(config)
    except StoreError as err:
        print(f"error: {err}" + (f"\nhint: {err.hint}" if err.hint else ""), file=sys.stderr)
        return 1
    controller = EndpointSliceController(store, resync=args.resync)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: controller.stop())
    try:
        controller.run()
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
