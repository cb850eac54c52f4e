"""``python -m lace.agent``: run the node agent (inside the node's network namespace)."""

from __future__ import annotations

import argparse
import logging
import sys

from lace.datapath.config import DEFAULT_POD_MTU, ENCAP_OVERHEAD
from lace.datapath.conntrack import CT_ENDPOINT_DEFAULT, CT_ENDPOINT_LIMIT_MAX
from lace.store.config import open_store
from lace.store.errors import StoreError

from .conntrack import GC_INTERVAL_SECONDS
from .daemon import Agent
from .heap import one_arena
from .liveness import DEFAULT_TTL

#: how often the agent's store watch polls for other processes' commits (pod start latency)
STORE_POLL_SECONDS = 0.005


def _seconds(text: str) -> float:
    """A positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _ct_limit(text: str) -> int:
    """A per-pod conntrack limit: 0 (none) to CT_ENDPOINT_LIMIT_MAX flows."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= CT_ENDPOINT_LIMIT_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is not a conntrack limit: use 1 to {CT_ENDPOINT_LIMIT_MAX} "
                                         "flows, or 0 for no limit")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lace-agent", description="lace node agent")
    ap.add_argument("--node", required=True)
    ap.add_argument("--store", required=True,
                    help="the store: the embedded store's file, or etcd://HOST:PORT[,...][/PREFIX]")
    ap.add_argument("--pin-root", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--uplink", default="eth0")
    ap.add_argument("--mtu", type=int, default=DEFAULT_POD_MTU,
                    help=f"pod MTU (the underlay MTU less the encapsulation's {ENCAP_OVERHEAD} bytes; "
                         f"default {DEFAULT_POD_MTU})")
    ap.add_argument("--cgroup", default=None, metavar="PATH",
                    help="the node's host cgroup (a cgroup2 directory): the socket hooks that let the "
                         "node's own processes reach service addresses attach there (default: none)")
    ap.add_argument("--kubelet-cgroup", default=None, metavar="PATH",
                    help="the kubelet's cgroup (cgroup2; inside --cgroup): only its sockets may open probes "
                         "into pods of other networks than the default (default: any process of --cgroup)")
    ap.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                    help="also serve Prometheus metrics over TCP on this port (default: only GET /metrics on "
                         "the socket)")
    ap.add_argument("--metrics-address", dest="metrics_addresses", action="append", metavar="ADDR",
                    help="address to serve metrics on (repeatable; default: the uplink's addresses)")
    ap.add_argument("--liveness-ttl", type=_seconds, default=DEFAULT_TTL, metavar="SECONDS",
                    help="the node's liveness record in the store expires this long after the agent last "
                         f"renewed it (every third of it): a dead or cut-off agent's node shows NotReady "
                         f"(default {DEFAULT_TTL:g})")
    ap.add_argument("--ct-endpoint-limit", type=_ct_limit, default=CT_ENDPOINT_DEFAULT, metavar="FLOWS",
                    help="the most conntrack flows one local pod may hold per table (TCP, UDP, ICMP, each per "
                         "IP family) when its Network sets no conntrackLimit; a new flow over it drops as "
                         f"ct-endpoint-limit; 0: no limit (default {CT_ENDPOINT_DEFAULT})")
    ap.add_argument("--ct-gc-interval", type=_seconds, default=GC_INTERVAL_SECONDS, metavar="SECONDS",
                    help="how often the conntrack tables are walked: expired entries deleted, each pod's "
                         f"flows recounted against its limit (default {GC_INTERVAL_SECONDS:g})")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("lace.agent")
    one_arena()   # before any thread (lace.agent.heap)
    try:
        store = open_store(args.store, poll_interval=STORE_POLL_SECONDS)
    except StoreError as e:
        log.error("agent failed: cannot open the store %s: %s%s", args.store, e,
                  f" ({e.hint})" if e.hint else "")
        return 1
    agent = Agent(node=args.node, store=store, pin_root=args.pin_root,
                  socket_path=args.socket, uplink=args.uplink, mtu=args.mtu, cgroup=args.cgroup,
                  kubelet_cgroup=args.kubelet_cgroup, metrics_port=args.metrics_port,
                  metrics_addresses=args.metrics_addresses, liveness_ttl=args.liveness_ttl,
                  ct_endpoint_limit=args.ct_endpoint_limit, ct_gc_interval=args.ct_gc_interval)
    try:
        agent.run_forever()
    except Exception as e:
        log.error("agent failed: %s: %s", type(e).__name__, e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
