"""``python -m lace.operator``: run the lace operator (the lace-operator Deployment's command)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    from lace.operator.operator import Options

    ap = argparse.ArgumentParser(prog="lace-operator", description=__doc__)
    ap.add_argument("--store", default="k8s://", help="the cluster (default: in-cluster, k8s://)")
    ap.add_argument("--locator-block", default=Options.locator_block)
    ap.add_argument("--locator-prefixlen", type=int, default=Options.locator_prefixlen)
    ap.add_argument("--leader-lease", default="lace-operator", help="the leader election Lease's name")
    ap.add_argument("--lease-duration", type=int, default=15)
    ap.add_argument("--resync", type=float, default=10.0, help="seconds between passes")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("lace.operator")
    from lace.operator.leader import LeaderElector
    from lace.operator.operator import NotLeading, reconcile
    from lace.store.config import StoreConfig, open_store
    from lace.store.errors import StoreError
    from lace.store.kubernetes import KubernetesStore

    try:
        config = StoreConfig.parse(args.store)
        store = open_store(config)
    except StoreError as err:
        print(f"error: {err}" + (f"\nhint: {err.hint}" if err.hint else ""), file=sys.stderr)
        return 1
    if not isinstance(store, KubernetesStore):
        print("error: the operator runs on a Kubernetes cluster (k8s://...); in the lab, the lab and the "
              "store do its work", file=sys.stderr)
        return 2
    options = Options(args.locator_block, args.locator_prefixlen)
    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    elector = LeaderElector(store.api, config.namespace, args.leader_lease, identity, args.lease_duration)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    last_pass = 0.0
    import time
    elector.start()   # renews in its own thread, also while a long pass runs
    try:
        while not stop.is_set():
            if elector.leading and time.monotonic() - last_pass >= args.resync:
                try:
                    result = reconcile(store, options, leading=lambda: elector.leading)
                    if result.networks or result.nodes or result.blocks or result.services:
                        log.info("pass: networks %s, nodes %s, blocks %s, services %s", result.networks,
                                 result.nodes, result.blocks, result.services)
                except NotLeading as err:
                    log.warning("%s", err)
                except StoreError as err:
                    log.warning("pass failed (next in %.0fs): %s%s", args.resync, err,
                                f" ({err.hint})" if err.hint else "")
                last_pass = time.monotonic()
            stop.wait(min(1.0, elector.retry or 1.0))
    finally:
        elector.stop()    # ends the renewals and gives the Lease up
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
