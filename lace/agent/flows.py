"""The flow stream: the agent's reader of the ``events`` ring buffer, a bounded history of decoded
flow decisions, and fan-out to any number of followers (``GET /v1/flows``).

The agent is the only consumer of the ring buffer.  One thread polls it (with a timeout, so it can
stop) and decodes each record once; every event gets ``time`` (wall clock, from the monotonic
``ts_ns`` through the offset between ``time.time()`` and ``time.monotonic()``) and ``node``.
Each follower has its own bounded queue: a slow follower loses events, never slows the reader or
other followers, and is told how many it lost (a ``{"lost": N}`` document in its stream).
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("lace.agent.flows")

Event = dict[str, Any]
Filter = Callable[[Event], bool]

FOLLOWER_QUEUE = 1024
POLL_MS = 200
#: how often a follower with nothing to say checks whether its client is still there
KEEPALIVE_S = 1.0


def _decode(raw: bytes) -> Event:
    from lace.datapath.trace import decode_trace_event
    return decode_trace_event(raw)


class _Follower:
    def __init__(self, filt: Filter, size: int) -> None:
        self.filt = filt
        self.q: queue.Queue[Event] = queue.Queue(size)
        self.lost = 0
        self.lock = threading.Lock()

    def offer(self, ev: Event) -> None:
        if not self.filt(ev):
            return
        try:
            self.q.put_nowait(ev)
        except queue.Full:
            with self.lock:
                self.lost += 1

    def take_lost(self) -> int:
        with self.lock:
            n, self.lost = self.lost, 0
        return n


class FlowCollector:
    """Reads the ``events`` ring buffer into history and followers once started.

    ``source`` replaces the ring buffer for tests: a callable ``poll(timeout_ms, deliver)`` that
    calls ``deliver(raw_bytes)`` per record.
    """

    def __init__(self, node: str, capacity: int = 10000, *,
                 source: Callable[[int, Callable[[bytes], Any]], Any] | None = None,
                 decode: Callable[[bytes], Event] = _decode, follower_queue: int = FOLLOWER_QUEUE) -> None:
        self.node = node
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
        if isinstance(ts, int):
            ev["time"] = (ts + self._offset_ns) / 1e9
        ev["node"] = self.node
        self.received += 1
        with self._lock:
            self.history_buf.append(ev)
            followers = list(self._followers)
        for f in followers:
            f.offer(ev)

    def _run(self) -> None:
        last_cal = time.monotonic()
        while not self._stop.is_set():
            try:
                self._source(POLL_MS, self._deliver)
            except Exception as exc:
                self.errors += 1
                log.warning("flow reader: %s", exc)
                self._stop.wait(0.5)
            if time.monotonic() - last_cal > 60:  # follow wall-clock steps (NTP)
                self._calibrate()
                last_cal = time.monotonic()

    def start(self, events_map: Any = None) -> None:
        """Start reading: ``events_map`` (a ring buffer ``lace.bpf.Map``) unless a test source was given."""
        if self._thread is not None:
            return
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

    # -- readers ---------------------------------------------------------------------------------

    def history(self, last: int = 0, filt: Filter | None = None) -> list[Event]:
        """The most recent ``last`` matching events (all kept ones when ``last`` is 0), oldest first."""
        with self._lock:
            events = list(self.history_buf)
        if filt is not None:
            events = [e for e in events if filt(e)]
        return events[-last:] if last else events

    def follow(self, filt: Filter | None = None, last: int = 0) -> Iterator[Event]:
        """``last`` past events, then every new matching one until the consumer stops iterating.

        Yields ``{"lost": N}`` when this follower's queue overflowed; ``{"keepalive": true}`` after
        a quiet second, so that a server notices a client that went away."""
        f = _Follower(filt or (lambda e: True), self._follower_queue)
        with self._lock:
            backlog = list(self.history_buf)
            self._followers.add(f)
        try:
            if last:
                for e in [e for e in backlog if f.filt(e)][-last:]:
                    yield e
            while not self._stop.is_set():
                try:
                    ev = f.q.get(timeout=KEEPALIVE_S)
                except queue.Empty:
                    lost = f.take_lost()
                    yield {"lost": lost} if lost else {"keepalive": True}
                    continue
                lost = f.take_lost()
                if lost:
                    yield {"lost": lost}
                yield ev
        finally:
            with self._lock:
                self._followers.discard(f)

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
        except ValueError as exc:
            return 400, {"error": str(exc)}
        if q.get("follow") in ("1", "true", "yes"):
            return 200, self.follow(filt, last)
        return 200, {"node": self.node, "flows": self.history(last, filt)}


# ---- filters ---------------------------------------------------------------------------------

_PROTOS = {"tcp", "udp", "icmp", "icmpv6", "sctp"}


def _unquote(v: str) -> str:
    from urllib.parse import unquote
    return unquote(v)


def parse_filter(q: dict[str, str]) -> Filter:
    """A predicate from query parameters: verdict, pod (ns/name; the CLI resolves it to ``ip``),
    ip (address or CIDR, either end), port (either end), proto.  ValueError names a bad one."""
    checks: list[Filter] = []
    verdict = q.get("verdict")
    if verdict:
        if verdict not in ("forward", "drop", "audit"):
            raise ValueError(f"verdict must be forward, drop or audit, not {verdict!r}")
        checks.append(lambda e: e.get("verdict") == verdict)
    ips = [x for x in _unquote(q.get("ip", "")).split(",") if x]
    if ips:
        try:
            nets = [ipaddress.ip_network(x, strict=False) for x in ips]
        except ValueError:
            raise ValueError(f"ip must be addresses or CIDRs, not {q.get('ip')!r}") from None

        def ip_match(e: Event) -> bool:
            for key in ("saddr", "daddr", "nat_addr"):
                a = e.get(key)
                if not a:
                    continue
                try:
                    addr = ipaddress.ip_address(a)
                except ValueError:
                    continue
                if any(addr.version == n.version and addr in n for n in nets):
                    return True
            return False
        checks.append(ip_match)
    port = q.get("port")
    if port:
        try:
            p = int(port)
        except ValueError:
            raise ValueError(f"port must be a number, not {port!r}") from None
        checks.append(lambda e: p in (e.get("sport"), e.get("dport"), e.get("nat_port")))
    proto = q.get("proto")
    if proto:
        if proto not in _PROTOS:
            raise ValueError(f"proto must be one of tcp, udp, icmp, sctp, not {proto!r}")
        want = {"icmp", "icmpv6"} if proto == "icmp" else {proto}
        checks.append(lambda e: str(e.get("proto")) in want or (proto == "sctp" and e.get("proto") == 132))
    pod_ip = q.get("pod_ip")  # the pod's addresses, as the CLI resolved them
    if pod_ip:
        addrs = set(_unquote(pod_ip).split(","))
        checks.append(lambda e: e.get("saddr") in addrs or e.get("daddr") in addrs)
    return lambda e: all(c(e) for c in checks)
