"""The flow stream: the agent's reader of the ``events`` ring buffer, a bounded history of flow
decisions, and fan-out to any number of followers (``GET /v1/flows``).

The agent is the only consumer of the ring buffer.  One thread waits on it (with a timeout, so it
can stop) and takes every committed record at once (``lace.bpf.RingReader``), then pauses
:data:`READ_PAUSE_S` so that a busy ring is read in batches of hundreds, not one wakeup per
record.  Records stay raw (128 bytes each, :data:`~lace.datapath.trace.TRACE_EVENT`) in blocks:
the history keeps blocks and followers queue them, so the reader does no work per record for a
follower without filters.  Records are decoded (``decode_trace_event``) only where a document is
made: the history's answer, a per-event follow stream, a filter's first look at a flow.  Every
event gets ``time`` (wall clock, from the monotonic ``ts_ns`` through the offset between
``time.time()`` and ``time.monotonic()`` when its block was read: :func:`~lace.datapath.trace.wall_time`)
and ``node``.

Losses are counted exactly, in two places:

* **ring**: an event the datapath could not put in the ring buffer (the reader was behind and
  the buffer full) is counted by the datapath per CPU at ``metrics`` index 0 (verdict 0, which no
  packet has; ``bpf/lib/trace.h``).  The collector reads that counter once a poll interval and
  reports the increase since it started (:attr:`FlowCollector.ring_lost`); every follower is
  told of the ring losses that happened while it followed.
* **reader**: each follower has its own bounded queue (in records); a slow follower loses events,
  never slows the reader or other followers, and is told how many it lost.

Followers get one document per line: an event, ``{"lost": N}`` (both kinds added up) or
``{"keepalive": true}`` after a quiet second.  With ``batch=raw`` (``lace observe``) the stream
is frames instead: a first JSON line ``{"follow": true, "node": ..., "record_size": 128, "flows":
[the --last backlog, decoded]}``, then per frame one JSON line ``{"records": N, "offset_ns": O,
"lost": L, "ring_lost": R}`` followed by the N raw records (N x 128 bytes; ``O`` makes their
``time``), up to :data:`BATCH` records a frame, and a frame of 0 records after a quiet second.
The records are the ring buffer's own bytes: the agent spends nothing per event on the stream,
and the CLI decodes only what it shows.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import orjson

from lace.datapath.trace import PER_PACKET_BYTES, TRACE_EVENT, decode_trace_event, record_ts, wall_time

log = logging.getLogger("lace.agent.flows")

Event = dict[str, Any]

#: a follower's queue, in records (8 MiB of raw records)
FOLLOWER_QUEUE = 65536
POLL_MS = 200
#: how long the bulk reader waits for records when none come: stop() wakes it at once, and the
#: loss counter is read only after records arrived, so an idle node's reader wakes once in this
IDLE_POLL_MS = 5000
#: after a read that found records, the reader waits this long before the next one: at 200,000
#: events/s a read then takes ~1,000 records (136 KB of the 4 MiB ring) instead of one per wakeup
READ_PAUSE_S = 0.005
#: how often a follower with nothing to say checks whether its client is still there
KEEPALIVE_S = 1.0
#: records per frame of a ``batch=raw`` stream (a frame may pass it by the rest of one ring read)
BATCH = 4096
#: metrics map index where the datapath counts events the ring buffer could not take (trace.h)
RING_LOST_INDEX = 0
#: a filter's cached answers per flow (the record from ``point`` on), forgotten past this many
FILTER_CACHE = 65536
RECORD = TRACE_EVENT.size
#: what a raw follow stream is served as
FRAMES_CONTENT_TYPE = "application/x-lace-flow-frames"


class Block(NamedTuple):
    """Records read from the ring buffer at once (back to back), and the clock offset they were
    read with (``wall_time``)."""

    data: bytes
    count: int
    offset_ns: int

    def events(self, node: str) -> Iterator[Event]:
        """Each record decoded, with its ``time`` and ``node``."""
        data, off = self.data, self.offset_ns
        for i, ts in enumerate(record_ts(data)):
            ev = decode_trace_event(data[i * RECORD:(i + 1) * RECORD])
            ev["time"] = wall_time(ts, off)
            ev["node"] = node
            yield ev


class History:
    """The newest ``capacity`` records in one buffer allocated up front (``capacity`` x 128 bytes),
    written round and round: the history costs the same memory from the agent's start however the
    traffic comes (a quiet node's records arrive one per read, and a block object each would cost
    as much again, growing for as long as the history is filling). Not thread-safe: the collector
    holds its lock around both methods."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        self._buf = bytearray(self.capacity * RECORD)
        self._offsets = np.zeros(self.capacity, dtype=np.int64)   # clock offset each was read with
        self._next = 0                                            # the slot the next record goes to
        self.kept = 0

    def add(self, block: Block) -> None:
        data, n = block.data, block.count
        if n > self.capacity:                    # only the newest fit
            data, n = data[(n - self.capacity) * RECORD:], self.capacity
        first = min(n, self.capacity - self._next)
        at = self._next
        self._buf[at * RECORD:(at + first) * RECORD] = data[:first * RECORD]
        self._offsets[at:at + first] = block.offset_ns
        if n > first:                            # round to the start
            self._buf[:(n - first) * RECORD] = data[first * RECORD:n * RECORD]
            self._offsets[:n - first] = block.offset_ns
        self._next = (at + n) % self.capacity
        self.kept = min(self.kept + n, self.capacity)

    def blocks(self) -> list[Block]:
        """What is kept, oldest first, copied out: one block per run of records read with the
        same clock offset (it changes rarely) and on each side of the buffer's end."""
        start = (self._next - self.kept) % self.capacity
        spans = [(start, min(start + self.kept, self.capacity))]
        if start + self.kept > self.capacity:
            spans.append((0, start + self.kept - self.capacity))
        out: list[Block] = []
        for lo, hi in spans:
            cuts = [lo, *(lo + 1 + np.flatnonzero(np.diff(self._offsets[lo:hi]))).tolist(), hi]
            for a, b in zip(cuts, cuts[1:]):
                out.append(Block(bytes(self._buf[a * RECORD:b * RECORD]), b - a, int(self._offsets[a])))
        return out


# ---- followers --------------------------------------------------------------------------------

class _Follower:
    """One client's queue of blocks.  The reader thread is the only writer of ``q`` (append),
    ``pushed`` and ``dropped``; the client's thread the only popper and the only writer of
    ``popped`` and ``reported``: exact without a lock."""

    def __init__(self, filt: FlowFilter | None, size: int, ring_lost: int) -> None:
        self.filt = filt
        self.q: collections.deque[Block] = collections.deque()
        self.size = size
        self.pushed = 0
        self.popped = 0
        self.dropped = 0
        self.reported = 0
        self.ring_base = ring_lost       # ring losses before this follower started are not its own
        self.ready = threading.Event()

    def offer(self, block: Block) -> None:
        if self.filt is not None:
            block = self.filt.select(block)
            if not block.count:
                return
        room = self.size - (self.pushed - self.popped)
        if room < block.count:           # what fits goes in; the rest is this follower's loss
            keep = max(room, 0)
            self.dropped += block.count - keep
            if not keep:
                return
            block = Block(block.data[:keep * RECORD], keep, block.offset_ns)
        self.q.append(block)
        self.pushed += block.count
        if len(self.q) == 1:
            self.ready.set()

    def pop(self) -> Block:
        block = self.q.popleft()
        self.popped += block.count
        return block

    def take_lost(self) -> int:
        n = self.dropped - self.reported
        self.reported += n
        return n


class FlowCollector:
    """Reads the ``events`` ring buffer into history and followers once started.

    ``source`` replaces the ring buffer for tests: a callable ``poll(timeout_ms)`` returning
    ``(records, others)`` as :meth:`lace.bpf.RingReader.read` does.  ``ring_lost_source`` (tests)
    replaces the datapath's counter of events the ring buffer could not take: a callable returning
    the running total.
    """

    def __init__(self, node: str, capacity: int = 10000, *,
                 source: Callable[[int], tuple[bytes, int]] | None = None,
                 follower_queue: int = FOLLOWER_QUEUE,
                 ring_lost_source: Callable[[], int] | None = None) -> None:
        self.node = node
        self.capacity = capacity
        #: the newest ``capacity`` records
        self.history_buf = History(capacity)
        self._followers: set[_Follower] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._follower_queue = follower_queue
        self.received = 0
        self.errors = 0
        self._ring: Any = None
        #: ends the reader's wait from stop(): the bulk reader's wake (None: the reader polls)
        self._wake: Callable[[], None] | None = None
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

    def add_records(self, data: bytes, others: int = 0) -> None:
        """Take records read from the ring buffer (back to back; the reader calls this, tests may
        too); ``others`` counts records of another size, which no decoder can read."""
        n, rest = divmod(len(data), RECORD)
        self.errors += others + (1 if rest else 0)
        if not n:
            return
        block = Block(data[:n * RECORD] if rest else data, n, self._offset_ns)
        self.received += n
        # one hold of the lock for the history and the fan-out: a follower registering meanwhile
        # gets the block either in its backlog or in its queue, never both, never neither
        with self._lock:
            self.history_buf.add(block)
            for f in self._followers_now:
                f.offer(block)

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
        assert self._source is not None
        last_cal = last_lost = time.monotonic()
        read = True   # records arrived since the loss counter was last read
        wait_ms = IDLE_POLL_MS if self._wake is not None else POLL_MS
        while not self._stop.is_set():
            try:
                data, others = self._source(wait_ms)
            except Exception as exc:
                self.errors += 1
                log.warning("flow reader: %s", exc)
                self._stop.wait(0.5)
            else:
                if data or others:
                    read = True
                    self.add_records(data, others)
                    self._stop.wait(READ_PAUSE_S)
            # under load a read returns at once: read the loss counter (a per-CPU map lookup) once
            # a poll interval, not after every read; and not at all while nothing arrives (a ring
            # loses records only when they come faster than they are read)
            now = time.monotonic()
            if read and now - last_lost >= POLL_MS / 1000:
                self.check_ring_lost()
                last_lost = now
                read = False
            if now - last_cal > 60:  # follow wall-clock steps (NTP)
                self._calibrate()
                last_cal = now

    def _ring_source(self, events_map: Any) -> Callable[[int], tuple[bytes, int]]:
        """Bulk reads of the ring (x86-64), else libbpf's reader with a callback per record."""
        from lace.bpf import NotSupported, RingBuffer, RingReader
        try:
            reader = RingReader(events_map)
        except NotSupported as exc:
            log.info("flow reader: %s; reading records one at a time", exc)
        else:
            self._ring = reader
            self._wake = reader.wake

            def bulk(timeout_ms: int) -> tuple[bytes, int]:
                return reader.read(RECORD) if reader.wait(timeout_ms) else (b"", 0)
            return bulk
        got: list[bytes] = []
        ring = self._ring = RingBuffer(events_map, got.append)

        def one_by_one(timeout_ms: int) -> tuple[bytes, int]:
            ring.poll(timeout_ms)
            records = [r for r in got if len(r) == RECORD]
            others = len(got) - len(records)
            got.clear()
            return b"".join(records), others
        return one_by_one

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
            self._source = self._ring_source(events_map)
        self._thread = threading.Thread(target=self._run, name="flows", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._wake is not None:
            self._wake()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        if self._ring is not None:
            self._ring.close()
            self._ring = None
            self._wake = None

    @property
    def native_thread_id(self) -> int | None:
        """The reader thread's kernel TID (its CPU time is in /proc/self/task/TID/stat)."""
        t = self._thread
        return t.native_id if t is not None else None

    def stats(self) -> dict[str, Any]:
        return {"node": self.node, "received": self.received, "errors": self.errors,
                "ring_lost": self.ring_lost, "followers": self.followers, "capacity": self.capacity,
                "kept": self.history_buf.kept}

    # -- readers ---------------------------------------------------------------------------------

    def _kept_events(self, blocks: list[Block]) -> list[Event]:
        """The events of history blocks, decoded."""
        events: list[Event] = []
        for b in blocks:
            events.extend(b.events(self.node))
        return events

    def history(self, last: int = 0, filt: FlowFilter | None = None) -> list[Event]:
        """The most recent ``last`` matching events (all kept ones when ``last`` is 0), oldest first."""
        with self._lock:
            blocks = self.history_buf.blocks()
        events = self._kept_events(blocks)
        if filt is not None:
            events = [e for e in events if filt(e)]
        return events[-last:] if last else events

    def _register(self, f: _Follower, last: int) -> list[Event]:
        """Add a follower; the ``last`` matching events before it came (under the lock: none is
        both in them and in its queue)."""
        with self._lock:
            blocks = self.history_buf.blocks() if last else []
            self._followers.add(f)
            self._followers_now = tuple(self._followers)
        if not last:
            return []
        events = self._kept_events(blocks)
        if f.filt is not None:
            events = [e for e in events if f.filt(e)]
        return events[-last:]

    def _unregister(self, f: _Follower) -> None:
        with self._lock:
            self._followers.discard(f)
            self._followers_now = tuple(self._followers)

    def _ring_delta(self, f: _Follower) -> int:
        n = self.ring_lost - f.ring_base
        f.ring_base += n
        return n

    def _wait(self, f: _Follower) -> bool:
        """Until ``f`` has records (True) or a keepalive second passed (False)."""
        if f.q:
            return True
        f.ready.clear()
        return bool(f.q) or f.ready.wait(KEEPALIVE_S)

    def follow(self, filt: FlowFilter | None = None, last: int = 0) -> Iterator[Event]:
        """``last`` past events, then every new matching one until the consumer stops iterating.

        Yields ``{"lost": N}`` when events were lost (this follower's queue overflowed, or the ring
        buffer was full); ``{"keepalive": true}`` after a quiet second, so that a server notices a
        client that went away."""
        f = _Follower(filt, self._follower_queue, self.ring_lost)
        try:
            yield from self._register(f, last)
            while not self._stop.is_set():
                if not self._wait(f):
                    lost = f.take_lost() + self._ring_delta(f)
                    yield {"lost": lost} if lost else {"keepalive": True}
                    continue
                block = f.pop()
                lost = f.take_lost() + self._ring_delta(f)
                if lost:
                    yield {"lost": lost}
                yield from block.events(self.node)
        finally:
            self._unregister(f)

    def follow_frames(self, filt: FlowFilter | None = None, last: int = 0,
                      batch: int = BATCH) -> Iterator[Event | bytes]:
        """As :meth:`follow`, in the ``batch=raw`` framing of the module docstring: the first
        document (a dict), then frames (bytes: their JSON header line and their records)."""
        f = _Follower(filt, self._follower_queue, self.ring_lost)
        try:
            backlog = self._register(f, last)
            yield {"follow": True, "node": self.node, "record_size": RECORD, "flows": backlog}
            q = f.q
            while not self._stop.is_set():
                if not self._wait(f):
                    yield self._frame(f, [], 0)
                    continue
                blocks = [f.pop()]
                n, off = blocks[0].count, blocks[0].offset_ns
                while q and n < batch and q[0].offset_ns == off:
                    blocks.append(f.pop())
                    n += blocks[-1].count
                yield self._frame(f, blocks, n)
        finally:
            self._unregister(f)

    def _frame(self, f: _Follower, blocks: list[Block], n: int) -> bytes:
        head = {"records": n, "offset_ns": blocks[0].offset_ns if blocks else self._offset_ns,
                "lost": f.take_lost(), "ring_lost": self._ring_delta(f)}
        return b"".join([orjson.dumps(head, option=orjson.OPT_APPEND_NEWLINE), *(b.data for b in blocks)])

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
            batch = q.get("batch")
            if batch and batch != "raw":
                raise ValueError(f"batch must be raw (frames of ring buffer records), not {batch!r}")
        except ValueError as exc:
            return 400, {"error": str(exc)}
        if q.get("follow") in ("1", "true", "yes"):
            if batch:
                return 200, (FRAMES_CONTENT_TYPE, self.follow_frames(filt, last))
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


def parse_filter(q: dict[str, str]) -> FlowFilter | None:
    """A predicate from query parameters, or None when there are none; ValueError names a bad one.

    verdict, reason, proto, port: comma-separated lists (any of them); ip (either end, or the NAT
    frontend), src_ip, dst_ip: addresses or CIDRs; pod_ip: addresses (either end; the CLI resolved
    a pod to them); since, until: wall-clock seconds since the epoch."""
    checks: list[Callable[[Event], bool]] = []
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
    bounds = []
    for key in ("since", "until"):
        bound = None
        if q.get(key):
            try:
                bound = float(_unquote(q[key]))
            except ValueError:
                raise ValueError(f"{key} must be seconds since the epoch, not {q.get(key)!r}") from None
        bounds.append(bound)
    if not checks and bounds == [None, None]:
        return None
    flow = None if not checks else checks[0] if len(checks) == 1 else (lambda e: all(c(e) for c in checks))
    return FlowFilter(flow, *bounds)


class FlowFilter:
    """What a follower or a history request asked for: ``flow``, checks of the flow's fields, and
    a time window (``since``/``until``, wall-clock seconds) checked per event.

    A block of raw records is filtered with one decoding per flow, not per event: ``flow``'s answer
    is kept by the record's bytes from ``point`` on (:data:`~lace.datapath.trace.PER_PACKET_BYTES`),
    which leaves out ts_ns, ifindex and pkt_len, the fields that change with every packet.  ``flow``
    sees the event without those fields (and without ``time``), so a check that read them would
    fail visibly rather than answer for another packet."""

    def __init__(self, flow: Callable[[Event], bool] | None, since: float | None = None,
                 until: float | None = None) -> None:
        self.flow = flow
        self.since = since
        self.until = until
        self._answers: dict[bytes, bool] = {}

    def _in_window(self, t: Any) -> bool:
        if self.since is None and self.until is None:
            return True
        if not isinstance(t, float):
            return False
        return (self.since is None or t >= self.since) and (self.until is None or t <= self.until)

    def __call__(self, e: Event) -> bool:
        return self._in_window(e.get("time")) and (self.flow is None or self.flow(e))

    def _flow_answer(self, key: bytes, record: bytes) -> bool:
        assert self.flow is not None
        ev = decode_trace_event(record)
        for k in ("ts_ns", "ifindex", "pkt_len"):
            del ev[k]
        if len(self._answers) >= FILTER_CACHE:
            self._answers.clear()
        ok = self._answers[key] = bool(self.flow(ev))
        return ok

    def select(self, block: Block) -> Block:
        """The block's matching records (the block itself when all match)."""
        data, off = block.data, block.offset_ns
        times = [wall_time(ts, off) for ts in record_ts(data)] if (self.since, self.until) != (None, None) else None
        answers, flow = self._answers, self.flow
        keep = []
        for i in range(block.count):
            o = i * RECORD
            if times is not None and not self._in_window(times[i]):
                continue
            if flow is not None:
                key = data[o + PER_PACKET_BYTES:o + RECORD]
                ok = answers.get(key)
                if ok is None:
                    ok = self._flow_answer(key, data[o:o + RECORD])
                if not ok:
                    continue
            keep.append(o)
        if len(keep) == block.count:
            return block
        return Block(b"".join([data[o:o + RECORD] for o in keep]), len(keep), off)
