"""Kubelet probes into pods of isolated networks: the agent's half.

The kubelet probes a pod from the node's host namespace. A pod of the default network is reached at
its own address, like any host connection to it. A pod of another network cannot be: its address
may be another network's too, even on the same node (two pods, one IP, the same probe port), and
the host device only routes the default network. So:

- **Probe address.** At CNI ADD the agent leases such a pod one address per family from this node's
  block of the default network (IPLease of the pseudo-pod ``probe/<namespace>/<name>``, container ID
  ``lace:probe:<container>``, released with the pod's own leases). The CNI result lists it on the
  host device ``lace_host``; the kubelet probes there. Two pods with the same address in two
  networks have two probe addresses: that is how they are told apart.
- **probes map** (``desired._probes``). ``(probe address, port, TCP) -> (network, endpoint, veth,
  the pod's own address, port)`` for every port the pod's probes name, plus the address's marker
  ``(probe address, 0, 0)``. Pods of the default network get entries at their own address for the
  record only; nothing about them changes.
- **probe-cookie map.** The host cgroup's connect hook records, for a socket of the kubelet's cgroup
  (``--kubelet-cgroup``) that connects to a probe target, ``cookie -> the destination it asked
  for``; the socket-release hook removes the entry when the socket closes.
- **Host device** (``lace_from_host``). A new flow to a probe target of another network passes only
  with its socket's cookie in probe-cookie for that very destination: it is translated to the pod's
  own address (two conntrack entries flagged PROBE — a frontend entry as a service flow has, and a
  backend entry its replies find — and a reply alias in the pod's network), checked against the pod's ingress policy for peer ``host`` and handed to that
  pod's veth. Everything else to a probe address — another port, another process, a raw packet, a
  pod or another node — is dropped as ``probe-denied`` and traced. The pod's replies leave from the
  probe address.

Why this is safe: nothing enters an isolated network from the host except a TCP connection that
(1) the kernel attributes to a socket of the kubelet's cgroup, (2) goes to an address:port the agent
derived from the pod's own probe spec, and (3) lands on that pod's veth only. The pod gets no second
interface and no route to the default network; no address of the isolated network is routed in the
host. Compare OVN-Kubernetes' user-defined networks, which give every pod an interface in the
default network and rely on an nftables rule matching the kubelet's cgroup: there the pod itself is
attached to the default network (an isolation boundary of rules rather than of topology), every port
behind that interface is open to the kubelet's cgroup, and a mistake in the rule set opens the pod.

``stale_cookies`` is the agent's collection of what the socket hooks leave: entries whose target is
no longer a probe (the pod went away mid-probe) and entries older than COOKIE_MAX_AGE (a socket whose
release the hook missed). A cookie is only needed for a flow's first packet; conntrack carries the
rest, so collecting one never breaks a probe in flight.
"""

from __future__ import annotations

from collections.abc import Iterable

from lace.datapath.probes import PROBE_COOKIE, PROBE_KEY

#: a probe connection's cookie is kept at most this long (a TCP connect gives up after ~2 min)
COOKIE_MAX_AGE_NS = 130 * 10**9


def stale_cookies(cookies: dict[bytes, bytes], probe_keys: Iterable[bytes], now_ns: int) -> list[bytes]:
    """The probe-cookie keys to delete: their destination is no probe target any more, or they are
    older than COOKIE_MAX_AGE_NS (``now_ns`` on CLOCK_MONOTONIC, the clock the datapath stamps)."""
    targets = set(probe_keys)
    out = []
    for k, v in cookies.items():
        c = PROBE_COOKIE.unpack(v)
        key = PROBE_KEY.pack(addr=c["orig_addr"], port=c["orig_port"], proto=c["proto"], family=c["family"])
        if key not in targets or now_ns - c["created_ns"] > COOKIE_MAX_AGE_NS:
            out.append(k)
    return out
