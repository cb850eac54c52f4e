"""The flow stream: the agent's reader of the ``events`` ring buffer, a bounded history of decoded
flow decisions, and fan-out to any number of followers (``GET /v1/flows``).

The agent is the only consumer of the ring buffer.  One thread polls it (with a timeout, so it can
stop) and decodes each record once (:func:`decode_event`, a precompiled ``struct`` that gives the
same document as ``lace.datapath.trace.decode_trace_event``); every event gets ``time`` (wall
clock, from the monotonic ``ts_ns`` through the offset between ``time.time()`` and
``time.monotonic()``) and ``node``.

Losses are counted exactly, in two places:

* **ring**: an event the datapath could not put in the ring buffer (the reader was behind and
  the buffer full) is counted by the datapath per CPU at ``metrics`` index 0 (verdict 0, which no
  packet has; ``bpf/lib/trace.h``).  The collector reads that counter after every poll and
  reports the increase since it started (:attr:`FlowCollector.ring_lost`); every follower is
  told of the ring losses that happened while it followed.
* **reader**: each follower has its own bounded queue; a slow follower loses events, never slows
  the reader or other followers, and is told how many it lost.

Followers get one document per line: an event, ``{"lost": N}`` (both kinds added up) or
``{"keepalive": true}`` after a quiet second.  With ``batch=1`` (``lace observe``) each line is
``{"flows": [...], "lost": N, "ring_lost": R}`` (up to :data:`BATCH` events per line, so a busy
stream costs one JSON encoding and one write per batch, not per event).
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from lace.datapath.trace import TRACE_EVENT

log = logging.getLogger("lace.agent.flows")

Event = dict[str, Any]
Filter = Callable[[Event], bool]

FOLLOWER_QUEUE = 65536
POLL_MS = 200
#: how often a follower with nothing to say checks whether its client is still there
KEEPALIVE_S = 1.0
#: events per line of a batched follow stream
BATCH = 2048
#: metrics map index where the datapath counts events the ring buffer could not take (trace.h)
RING_LOST_INDEX = 0


# ---- decoding ---------------------------------------------------------------------------------

#: struct lace_trace_event as its Layout compiles it (the big-endian ports come as raw u16: swapped below)
_EVENT = TRACE_EVENT.struct


def _labels() -> dict[str, Any]:
    from lace.datapath.common import Family, Proto, Verdict, enum_label
    from lace.datapath.conntrack import CtStatus, tcp_flag_labels
    from lace.datapath.delivery import DeliveryKind
    from lace.datapath.reasons import DropReason, TracePoint
    from lace.datapath.trace import NatKind

    def table(cls: Any, n: int = 256) -> list[Any]:
        return [enum_label(cls, i) for i in range(n)]
    return {"point": table(TracePoint), "verdict": table(Verdict), "reason": table(DropReason, 1024),
            "family": table(Family), "proto": table(Proto), "ct_status": table(CtStatus),
            "delivery": table(DeliveryKind), "nat": table(NatKind),
            "tcp_flags": [tcp_flag_labels(i) for i in range(256)],
            "ipv4": int(Family.IPV4), "ipv6": int(Family.IPV6), "tcp": int(Proto.TCP),
            "remote": int(DeliveryKind.REMOTE)}


_L: dict[str, Any] | None = None


def _addr(fam: int, raw: bytes, v4: int, v6: int) -> str:
    if fam == v4:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    if fam == v6:
        if raw[:12] == b"\0" * 10 + b"\xff\xff":  # v4-mapped: ipaddress's spelling, as the decoder's
            return str(ipaddress.IPv6Address(raw))
        return socket.inet_ntop(socket.AF_INET6, raw)
    return raw.hex()


def decode_event(raw: bytes) -> Event:
    """One ring buffer record as ``decode_trace_event`` gives it, about five times faster."""
    global _L
    L = _L or _labels()
    _L = L
    (ts, ifindex, pkt_len, point, verdict, reason, fam, proto, ct_status, delivery, src_net, dst_net,
     src_seg, dst_seg, saddr, daddr, sport, dport, policy_id, nat_addr, nat_port, nat_kind, tcp_flags,
     delivery_ifindex, sid, node_id, rule, _reserved) = _EVENT.unpack_from(raw)
    v4, v6 = L["ipv4"], L["ipv6"]
    return {
        "ts_ns": ts, "ifindex": ifindex, "pkt_len": pkt_len,
        "point": L["point"][point], "verdict": L["verdict"][verdict],
        "reason": L["reason"][reason] if reason < 1024 else reason,
        "family": L["family"][fam], "proto": L["proto"][proto], "ct_status": L["ct_status"][ct_status],
        "delivery": L["delivery"][delivery],
        "src_network": src_net, "dst_network": dst_net, "src_segment": src_seg, "dst_segment": dst_seg,
        "saddr": _addr(fam, saddr, v4, v6), "daddr": _addr(fam, daddr, v4, v6),
        "sport": ((sport & 0xFF) << 8) | (sport >> 8), "dport": ((dport & 0xFF) << 8) | (dport >> 8),
        "tcp_flags": L["tcp_flags"][tcp_flags] if proto == L["tcp"] else [],
        "policy_id": policy_id, "rule": rule,
        "nat_kind": L["nat"][nat_kind],
        "nat_addr": _addr(fam, nat_addr, v4, v6) if nat_kind else None,
        "nat_port": (((nat_port & 0xFF) << 8) | (nat_port >> 8)) if nat_kind else None,
        "delivery_ifindex": delivery_ifindex,
        "sid": socket.inet_ntop(socket.AF_INET6, sid) if delivery == L["remote"] else None,
        "node_id": node_id,
    }


def _decode(raw: bytes) -> Event:
    return decode_event(raw)


# ---- followers --------------------------------------------------------------------------------

class _Follower:
    """One client's queue.  The reader thread is the only writer of ``q`` (append) and ``dropped``;
    the client's thread the only popper and the only writer of ``reported``: exact without a lock."""

    def __init__(self, filt: Filter | None, size: int, ring_lost: int) -> None:
        self.filt = filt
        self.q: collections.deque[Event] = collections.deque()
        self.size = size
        self.dropped = 0
        self.reported = 0
        self.ring_base = ring_lost       # ring losses before this follower started are not its own
        self.ready = threading.Event()

    def offer(self, ev: Event) -> None:
        if self.filt is not None and not self.filt(ev):
            return
        q = self.q
        if len(q) >= self.size:
            self.dropped += 1
            return
        q.append(ev)
        if len(q) == 1:
            self.ready.set()

    def take_lost(self) -> int:
        n = self.dropped - self.reported
        self.reported += n
        return n


class FlowCollector:
    """Reads the ``events`` ring buffer into history and followers once started.

    ``source`` replaces the ring buffer for tests: a callable ``poll(timeout_ms, deliver)`` that
    calls ``deliver(raw_bytes)`` per record.  ``ring_lost_source`` (tests) replaces the datapath's
    counter of events the ring buffer could not take: a callable returning the running total.
    """

    def __init__(self, node: str, capacity: int = 10000, *,
                 source: Callable[[int, Callable[[bytes], Any]], Any] | None = None,
                 decode: Callable[[bytes], Event] = _decode, follower_queue: int = FOLLOWER_QUEUE,
                 ring_lost_source: Callable[[], int] | None = None) -> None:
        self.node = node
        self.capacity = capacity
        self.history_buf: collections.deque[Event] = collections.deque(maxlen=capacity)
        self._followers: set[_Follower] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._decode = decode
        self._follower_queue = follower_queue
        self.received = 0
        self.errors = 0
        self._ring: Any = None
        self._source = source
        self._ring_lost_source = ring_lost_source
        self._ring_lost_base: int | None = None
        self.ring_lost = 0
        self._offset_ns = 0
        self._calibrate()

    def _calibrate(self) -> None:
        # ts_ns is CLOCK_MONOTONIC (bpf_ktime_get_ns): wall = ts + (time.time() - time.monotonic())
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    # -- the reader ------------------------------------------------------------------------------

    def _deliver(self, raw: bytes) -> int:
        try:
            ev = self._decode(raw)
        except Exception:  # a short or unknown record: count it, keep reading
            self.errors += 1
            return 0
        self.add(ev)
        return 0

    def add(self, ev: Event) -> None:
        """Record one decoded event (the reader calls this; tests may too)."""
        ts = ev.get("ts_ns")
        if ts.__class__ is int:
            ev["time"] = (ts + self._offset_ns) / 1e9
        ev["node"] = self.node
        self.received += 1
        self.history_buf.append(ev)   # deque.append is atomic; history() copies under the GIL
        for f in self._followers_now:
            f.offer(ev)

    _followers_now: tuple[_Follower, ...] = ()

    def check_ring_lost(self) -> int:
        """Read the datapath's count of events the ring buffer could not take; the increase since start."""
        if self._ring_lost_source is None:
            return self.ring_lost
        try:
            total = int(self._ring_lost_source())
        except Exception as exc:  # noqa: BLE001 - a counter we cannot read is no reason to stop
            log.debug("ring lost counter: %s", exc)
            return self.ring_lost
        if self._ring_lost_base is None:
            self._ring_lost_base = total
        self.ring_lost = total - self._ring_lost_base
        return self.ring_lost

    def _run(self) -> None:
        last_cal = last_lost = time.monotonic()
        while not self._stop.is_set():
            try:
                self._source(POLL_MS, self._deliver)
            except Exception as exc:
                self.errors += 1
                log.warning("flow reader: %s", exc)
                self._stop.wait(0.5)
            # under load a poll returns as soon as the ring is drained: read the loss counter (a
            # per-CPU map lookup) once a poll interval, not after every poll
            now = time.monotonic()
            if now - last_lost >= POLL_MS / 1000:
                self.check_ring_lost()
                last_lost = now
            if time.monotonic() - last_cal > 60:  # follow wall-clock steps (NTP)
                self._calibrate()
                last_cal = time.monotonic()

    def start(self, events_map: Any = None, metrics_map: Any = None) -> None:
        """Start reading: ``events_map`` (a ring buffer ``lace.bpf.Map``) unless a test source was
        given; ``metrics_map`` (the per-CPU ``metrics`` map) gives the ring-buffer loss counter."""
        if self._thread is not None:
            return
        if metrics_map is not None and self._ring_lost_source is None:
            key = RING_LOST_INDEX.to_bytes(4, "little")

            def ring_lost() -> int:
                vals = metrics_map.lookup_percpu(key) or []
                return sum(int.from_bytes(v[:8], "little") for v in vals)
            self._ring_lost_source = ring_lost
        self.check_ring_lost()
        if self._source is None:
            from lace.bpf import RingBuffer
            self._ring = RingBuffer(events_map, self._deliver)
            self._source = lambda ms, _deliver: self._ring.poll(ms)
        self._thread = threading.Thread(target=self._run, name="flows", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        if self._ring is not None:
            self._ring.close()
            self._ring = None

    @property
    def native_thread_id(self) -> int | None:
        """The reader thread's kernel TID (its CPU time is in /proc/self/task/TID/stat)."""
        t = self._thread
        return t.native_id if t is not None else None

    def stats(self) -> dict[str, Any]:
        return {"node": self.node, "received": self.received, "errors": self.errors,
                "ring_lost": self.ring_lost, "followers": self.followers, "capacity": self.capacity,
                "kept": len(self.history_buf)}

    # -- readers ---------------------------------------------------------------------------------

    def history(self, last: int = 0, filt: Filter | None = None) -> list[Event]:
        """The most recent ``last`` matching events (all kept ones when ``last`` is 0), oldest first."""
        with self._lock:
            events = list(self.history_buf)
        if filt is not None:
            events = [e for e in events if filt(e)]
        return events[-last:] if last else events

    def _register(self, f: _Follower) -> list[Event]:
        with self._lock:
            backlog = list(self.history_buf)
            self._followers.add(f)
            self._followers_now = tuple(self._followers)
        return backlog

    def _unregister(self, f: _Follower) -> None:
        with self._lock:
            self._followers.discard(f)
            self._followers_now = tuple(self._followers)

    def _ring_delta(self, f: _Follower) -> int:
        n = self.ring_lost - f.ring_base
        f.ring_base += n
        return n

    def follow(self, filt: Filter | None = None, last: int = 0) -> Iterator[Event]:
        """``last`` past events, then every new matching one until the consumer stops iterating.

        Yields ``{"lost": N}`` when events were lost (this follower's queue overflowed, or the ring
        buffer was full); ``{"keepalive": true}`` after a quiet second, so that a server notices a
        client that went away."""
        f = _Follower(filt, self._follower_queue, self.ring_lost)
        backlog = self._register(f)
        try:
            if last:
                for e in [e for e in backlog if filt is None or filt(e)][-last:]:
                    yield e
            while not self._stop.is_set():
                if not f.q:
                    f.ready.clear()
                    if not f.q and not f.ready.wait(KEEPALIVE_S):
                        lost = f.take_lost() + self._ring_delta(f)
                        yield {"lost": lost} if lost else {"keepalive": True}
                        continue
                ev = f.q.popleft()
                lost = f.take_lost() + self._ring_delta(f)
                if lost:
                    yield {"lost": lost}
                yield ev
        finally:
            self._unregister(f)

    def follow_batches(self, filt: Filter | None = None, last: int = 0,
                       batch: int = BATCH) -> Iterator[dict[str, Any]]:
        """As :meth:`follow`, one ``{"flows": [...], "lost": N, "ring_lost": R}`` document per batch
        (``{"keepalive": true, ...}`` when quiet); the first document has ``"follow": true``."""
        f = _Follower(filt, self._follower_queue, self.ring_lost)
        backlog = self._register(f)
        try:
            first = {"follow": True, "node": self.node, "flows": []}
            if last:
                first["flows"] = [e for e in backlog if filt is None or filt(e)][-last:]
            yield first
            q = f.q
            pop = q.popleft
            while not self._stop.is_set():
                if not q:
                    f.ready.clear()
                    if not q and not f.ready.wait(KEEPALIVE_S):
                        yield {"keepalive": True, "lost": f.take_lost(), "ring_lost": self._ring_delta(f)}
                        continue
                n = min(len(q), batch)
                flows = [pop() for _ in range(n)]
                yield {"flows": flows, "lost": f.take_lost(), "ring_lost": self._ring_delta(f)}
        finally:
            self._unregister(f)

    @property
    def followers(self) -> int:
        with self._lock:
            return len(self._followers)

    # -- API ---------------------------------------------------------------------------------

    def routes(self) -> list[tuple[str, str, Callable[[dict[str, Any]], tuple[int, Any]]]]:
        return [("GET", "/v1/flows", self._handle)]

    def _handle(self, body: dict[str, Any]) -> tuple[int, Any]:
        q = body.get("_query") or {}
        try:
            filt = parse_filter(q)
            last = int(q.get("last") or 0)
            if last < 0:
                raise ValueError(f"last must be 0 or more, not {last}")
        except ValueError as exc:
            return 400, {"error": str(exc)}
        if q.get("follow") in ("1", "true", "yes"):
            if q.get("batch") in ("1", "true", "yes"):
                return 200, self.follow_batches(filt, last)
            return 200, self.follow(filt, last)
        self.check_ring_lost()
        return 200, {"node": self.node, "flows": self.history(last, filt), **self.stats()}


# ---- filters ---------------------------------------------------------------------------------

_PROTOS = {"tcp", "udp", "icmp", "icmpv6", "sctp"}
_VERDICTS = ("forward", "drop", "audit")


def _unquote(v: str) -> str:
    from urllib.parse import unquote
    return unquote(v)


def _list(q: dict[str, str], key: str) -> list[str]:
    return [x for x in _unquote(q.get(key, "")).split(",") if x]


def _nets(q: dict[str, str], key: str) -> list[Any]:
    try:
        return [ipaddress.ip_network(x, strict=False) for x in _list(q, key)]
    except ValueError:
        raise ValueError(f"{key} must be addresses or CIDRs, not {_unquote(q.get(key, ''))!r}") from None


def _addr_in(nets: list[Any]) -> Callable[[str | None], bool]:
    exact = {str(n.network_address) for n in nets if n.prefixlen == n.max_prefixlen}
    wide = [n for n in nets if n.prefixlen != n.max_prefixlen]

    def match(a: str | None) -> bool:
        if not a:
            return False
        if a in exact:
            return True
        if not wide:
            return False
        try:
            addr = ipaddress.ip_address(a)
        except ValueError:
            return False
        return any(addr.version == n.version and addr in n for n in wide)
    return match


def parse_filter(q: dict[str, str]) -> Filter | None:
    """A predicate from query parameters, or None when there are none; ValueError names a bad one.

    verdict, reason, proto, port: comma-separated lists (any of them); ip (either end, or the NAT
    frontend), src_ip, dst_ip: addresses or CIDRs; pod_ip: addresses (either end; the CLI resolved
    a pod to them); since, until: wall-clock seconds since the epoch."""
    checks: list[Filter] = []
    verdicts = _list(q, "verdict")
    if verdicts:
        bad = [v for v in verdicts if v not in _VERDICTS]
        if bad:
            raise ValueError(f"verdict must be forward, drop or audit, not {bad[0]!r}")
        vs = frozenset(verdicts)
        checks.append(lambda e: e.get("verdict") in vs)
    reasons = frozenset(_list(q, "reason"))
    if reasons:
        checks.append(lambda e: e.get("reason") in reasons)
    nets = _nets(q, "ip")
    if nets:
        m = _addr_in(nets)
        checks.append(lambda e: m(e.get("saddr")) or m(e.get("daddr")) or m(e.get("nat_addr")))
    src = _nets(q, "src_ip")
    if src:
        ms = _addr_in(src)
        checks.append(lambda e: ms(e.get("saddr")))
    dst = _nets(q, "dst_ip")
    if dst:
        md = _addr_in(dst)
        checks.append(lambda e: md(e.get("daddr")) or md(e.get("nat_addr")))
    ports_text = _list(q, "port")
    if ports_text:
        try:
            ports = frozenset(int(p) for p in ports_text)
        except ValueError:
            raise ValueError(f"port must be a number, not {q.get('port')!r}") from None
        checks.append(lambda e: e.get("sport") in ports or e.get("dport") in ports or e.get("nat_port") in ports)
    protos = _list(q, "proto")
    if protos:
        bad = [p for p in protos if p not in _PROTOS]
        if bad:
            raise ValueError(f"proto must be one of tcp, udp, icmp, sctp, not {bad[0]!r}")
        want = set(protos) | ({"icmpv6"} if "icmp" in protos else set())
        checks.append(lambda e: str(e.get("proto")) in want)
    pod_ip = q.get("pod_ip")  # the pod's addresses, as the CLI resolved them
    if pod_ip:
        addrs = set(_unquote(pod_ip).split(","))
        checks.append(lambda e: e.get("saddr") in addrs or e.get("daddr") in addrs)
    for key, cmp in (("since", float.__ge__), ("until", float.__le__)):
        if q.get(key):
            try:
                bound = float(_unquote(q[key]))
            except ValueError:
                raise ValueError(f"{key} must be seconds since the epoch, not {q.get(key)!r}") from None
            checks.append(lambda e, b=bound, c=cmp: isinstance(e.get("time"), float) and c(e["time"], b))
    if not checks:
        return None
    if len(checks) == 1:
        return checks[0]
    return lambda e: all(c(e) for c in checks)
