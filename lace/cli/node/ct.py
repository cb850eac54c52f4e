"""``node ct list TABLE`` and ``node ct gc TABLE``: live conntrack entries, and removing expired ones.

TABLE is ``all`` or one of ct-{tcp,udp,icmp}-{v6,v4}.  Entry times are CLOCK_MONOTONIC_COARSE
nanoseconds (``bpf_ktime_get_coarse_ns``), compared with the same clock here.

A node can hold a million entries, so both commands work on whole columns: the dump is one batch
syscall sequence, decoding is ``Layout.decode_many`` (NumPy), ``-o json`` is assembled by
:mod:`lace.textcols` without a Python object per entry, and gc deletes in batches.
Names (networks, segments, pods, services) are resolved once per distinct value, not per entry.

gc removes only entries whose expiry is in the past at the moment of the dump; an entry refreshed
by a packet between the dump and the delete (milliseconds) is removed too and re-created by its
next packet, which is what an LRU eviction would do to it anyway.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from lace import textcols as C
from lace.cli.node.env import NodeEnv
from lace.cli.errors import UsageError
from lace.cli.node.resolve import NumericResolver, for_node
from lace.cli.status import ExitStatus
from lace.datapath import registry
from lace.datapath.common import Proto, enum_label, flag_labels
from lace.datapath.conntrack import CT4_KEY, CT6_KEY, CT_ENTRY, CtFlag, CtState, tcp_flag_labels
from lace.datapath.delivery import DeliveryKind

if TYPE_CHECKING:
    from lace.cli.invocation import Invocation


CLOCK_MONOTONIC_COARSE = getattr(time, "CLOCK_MONOTONIC_COARSE", 6)  # Linux; Python 3.11 lacks the name
TABLES = ("all", *registry.CT_TABLES)


def now_coarse() -> int:
    return time.clock_gettime_ns(CLOCK_MONOTONIC_COARSE)


def register(sub: Any, add_common: Callable[..., None]) -> None:
    ct = sub.add_parser("ct", help="connection tracking: list live entries, remove expired ones",
                        description="Conntrack tables: " + ", ".join(TABLES) + ".")
    add_common(ct)
    csub = ct.add_subparsers(dest="ct_command", metavar="SUBCOMMAND", parser_class=type(ct))
    p = csub.add_parser("list", help="list live conntrack entries",
                        description="List conntrack entries of TABLE (" + ", ".join(TABLES) + ").")
    p.add_argument("table", metavar="TABLE", help=", ".join(TABLES))
    add_common(p)
    p.set_defaults(handler=run_list)
    p = csub.add_parser("gc", help="remove expired conntrack entries",
                        description="Remove the expired entries of TABLE (" + ", ".join(TABLES) + ").")
    p.add_argument("table", metavar="TABLE", help=", ".join(TABLES))
    add_common(p)
    p.set_defaults(handler=run_gc)
    ct.set_defaults(handler=lambda a, inv: (_ for _ in ()).throw(
        UsageError("say what to do: node ct list TABLE | node ct gc TABLE", hint="tables: " + ", ".join(TABLES))))


def tables_of(arg: str) -> tuple[str, ...]:
    if arg == "all":
        return registry.CT_TABLES
    if arg not in registry.CT_TABLES:
        raise UsageError(f'unknown conntrack table "{arg}"', hint="tables: " + ", ".join(TABLES))
    return (arg,)


@dataclass
class CtDump:
    """One conntrack table as dumped: its decoded key and entry columns (NumPy structured arrays)."""

    name: str
    family: int
    keys: np.ndarray
    vals: np.ndarray
    capacity: int

    @property
    def count(self) -> int:
        return len(self.keys)


def _dump(name: str, m: Any) -> CtDump:
    """Dump conntrack table ``name`` from its open map ``m`` (closed here)."""
    family = 6 if name.endswith("v6") else 4
    layout = CT6_KEY if family == 6 else CT4_KEY
    with m:
        kb, vb, n = m.dump()
        cap = m.max_entries
    # the dump's buffers are a fresh mapping per dump that lives as long as these views: no copy
    keys = layout.decode_many(kb, n)
    vals = CT_ENTRY.decode_many(vb, n)
    return CtDump(name, family, keys, vals, cap)


#: tables dumped (or collected) at once: a batch lookup runs in the kernel without the GIL, so
#: two threads use both cores of a small node
WORKERS = 2


def _parallel(node_env: NodeEnv, names: tuple[str, ...], work: Callable[[str, Any], Any],
              meanwhile: Callable[[], None] | None = None) -> list[Any]:
    """``work(name, map)`` for every table on WORKERS threads, largest capacity first, results in
    ``names`` order.  Maps are opened here first, so a missing one fails as it always did; and
    ``meanwhile`` (loading the store) runs on this thread while the kernel works."""
    maps = [node_env.open_map(registry.get(name).pin_name, name) for name in names]
    if len(names) == 1:
        if meanwhile is not None:
            meanwhile()
        return [work(names[0], maps[0])]
    from concurrent.futures import ThreadPoolExecutor
    order = sorted(range(len(names)), key=lambda i: -maps[i].max_entries)
    with ThreadPoolExecutor(WORKERS) as ex:
        futs = {i: ex.submit(work, names[i], maps[i]) for i in order}
        if meanwhile is not None:
            meanwhile()
        return [futs[i].result() for i in range(len(names))]


# ---- tokens for enum columns ------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _enum_tokens(cls: Any) -> list[str]:
    out = []
    for i in range(256):
        lab = enum_label(cls, i)
        out.append(orjson.dumps(lab).decode())
    return out


@functools.lru_cache(maxsize=None)
def _flags_tokens() -> list[str]:
    return [orjson.dumps(flag_labels(CtFlag, i)).decode() for i in range(256)]


def _proto_tokens() -> list[str]:
    return _enum_tokens(Proto)


def _named_codes(values: np.ndarray, name_of: Callable[[int], str | None]) -> tuple[np.ndarray, list[str]]:
    """Resolve each distinct value once: (code per row, JSON tokens by code)."""
    uniq, inv = np.unique(values, return_inverse=True)
    return inv, [orjson.dumps(name_of(int(u))).decode() for u in uniq]


def _pod_codes(t: CtDump, field: str, res: NumericResolver) -> tuple[np.ndarray, list[str]]:
    """Pod of each row's address (in the key's network), matched by sorted search against the
    store's known pod addresses of the networks present."""
    n = t.count
    width = 4 if t.family == 4 else 16
    comb = np.zeros((n, 4 + width), dtype=np.uint8)
    comb[:, :4] = t.keys["network"].astype(">u4").view(np.uint8).reshape(n, 4)
    comb[:, 4:] = np.ascontiguousarray(t.keys[field]).view(np.uint8).reshape(n, width)
    known: dict[bytes, str] = {}
    import ipaddress
    for net in np.unique(t.keys["network"]).tolist():
        for ip, pod in res.ips_to_pods(int(net)).items():
            a = ipaddress.ip_address(ip)
            if a.version == t.family:
                known[int(net).to_bytes(4, "big") + a.packed] = pod
    codes = np.zeros(n, dtype=np.int64)
    tokens = ["null"]
    if known:
        ks = sorted(known)
        arr = np.frombuffer(b"".join(ks), dtype=f"V{4 + width}")
        rows = comb.view(f"V{4 + width}").ravel()
        # compare as bytes: V dtypes sort and search by memcmp
        pos = np.searchsorted(arr, rows)
        pos = np.minimum(pos, len(arr) - 1)
        hit = arr[pos] == rows
        codes = np.where(hit, pos + 1, 0)
        tokens += [orjson.dumps(known[k]).decode() for k in ks]
    return codes, tokens


def json_rows(t: CtDump, now: int, res: NumericResolver) -> C.Rows:
    """One JSON object per entry of a table (see the module docstring): a fixed layout whose
    slots :mod:`lace.textcols` writes a chunk of rows at a time."""
    k, v, n = t.keys, t.vals, t.count
    fam = t.family
    rows = C.Rows(n)
    rows.lit('{"table":"' + t.name + '"')
    rows.key("network")
    _id_and_name(rows, k["network"], None if res.numeric else ("network_name", res.network))
    rows.key("proto")
    rows.tokens(k["proto"], _proto_tokens(), used=C.used_codes(k["proto"]))
    for addr, port in (("saddr", "sport"), ("daddr", "dport")):
        rows.key(addr)
        rows.address(_addr_source(k, addr, fam), fam)
        rows.key(port)
        rows.number(C.field_view(k, port, ">u2"))
    if not res.numeric:
        for addr, label in (("saddr", "src_pod"), ("daddr", "dst_pod")):
            codes, toks = _pod_codes(t, addr, res)
            rows.key(label)
            rows.tokens(codes, toks)
    flags = v["flags"]
    rows.key("state")
    rows.tokens(v["state"], _enum_tokens(CtState), used=C.used_codes(v["state"]))
    rows.key("flags")
    rows.tokens(flags, _flags_tokens(), used=C.used_codes(flags))
    rows.key("delivery")
    rows.tokens(v["delivery"], _enum_tokens(DeliveryKind), used=C.used_codes(v["delivery"]))
    nat = (flags & np.uint8(CtFlag.DNAT | CtFlag.SNAT)) == 0
    rows.key("nat_addr")
    rows.address(_addr_source(v, "nat_addr", fam), fam, null=nat)
    rows.key("nat_port")
    rows.number(C.field_view(v, "nat_port", ">u2"), null=nat)
    for f in ("packets_fwd", "bytes_fwd", "packets_rev", "bytes_rev"):
        rows.key(f)
        rows.number(v[f])
    for f in ("src_segment", "dst_segment"):
        rows.key(f)
        _id_and_name(rows, v[f], None if res.numeric else (f + "_name", res.segment))
    rows.key("dst_network")
    rows.number(v["dst_network"])
    rows.key("rev_nat_id")
    _id_and_name(rows, v["rev_nat_id"], None if res.numeric else
                 ("service", lambda i: res.service(i) if i else None))
    nowv = np.int64(now)
    ns = np.int64(10**9)
    rows.key("age_s")
    rows.slot(_Derived(v["created_ns"], lambda c: np.maximum((nowv - c.astype(np.int64)) // ns, 0)))
    rows.key("idle_s")
    rows.slot(_Derived(v["last_seen_ns"], lambda c: np.maximum((nowv - c.astype(np.int64)) // ns, 0)))
    rows.key("expires_in_s")
    rows.slot(_Derived(v["expires_ns"], lambda c: _toward_zero(c.astype(np.int64) - nowv, ns), signed=True))
    exp = v["expires_ns"]
    rows.key("expired")
    rows.tokens(lambda a, b: (exp[a:b].astype(np.int64) <= nowv).view(np.uint8), ["false", "true"])
    rows.lit("}")
    return rows


def _toward_zero(left: np.ndarray, ns: np.int64) -> np.ndarray:
    """Whole seconds, truncated toward zero (-1.5 s is -1)."""
    q = left // ns
    q += (left < 0) & (q * ns != left)
    return q


class _Derived(C.Number):
    """A number slot computed per chunk from a column (ages from timestamps): the width comes from
    the extremes of the column, the text from each chunk."""

    def __init__(self, column: np.ndarray, fn: Callable[[np.ndarray], np.ndarray], signed: bool = False) -> None:
        ext = fn(np.array([column.min(), column.max()], dtype=column.dtype)) if len(column) else np.zeros(2, np.int64)
        super().__init__(np.asarray(ext, dtype=np.int64))
        if not signed:  # monotone in the column: min/max bound every value
            self.neg = False
        self.column, self.fn = column, fn

    def fill(self, buf: np.ndarray, off: int, a: int, b: int) -> None:
        self.put(buf, off, self.fn(self.column[a:b]))


def _addr_source(arr: np.ndarray, field: str, family: int) -> np.ndarray:
    return C.field_view(arr, field, ">u4") if family == 4 else C.field_view(arr, field, ">u2", 8)


def _id_and_name(rows: C.Rows, ids: np.ndarray, named: tuple[str, Callable[[int], str | None]] | None) -> None:
    """An ID column and, unless numeric, the name after it (``"network":2,"network_name":"blue"``):
    one token per distinct ID when there are few, else the number and names by code."""
    cat = C.categorize(ids)
    if cat is None:
        rows.number(ids)
        if named is not None:
            key, name_of = named
            codes, toks = _named_codes(ids, name_of)
            rows.key(key)
            rows.tokens(codes, toks)
        return
    codes, uniq = cat
    if named is None:
        rows.tokens(codes, [str(int(u)) for u in uniq.tolist()])
        return
    key, name_of = named
    rows.tokens(codes, [f'{int(u)},"{key}":' + orjson.dumps(name_of(int(u))).decode() for u in uniq.tolist()])


def _take(t: CtDump, count: int, start: int = 0) -> CtDump:
    return CtDump(t.name, t.family, t.keys[start:start + count], t.vals[start:start + count], t.capacity)


def run_list(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    names = tables_of(args.table)
    node_env = NodeEnv.from_env(inv.env)
    res = for_node(args.numeric, node_env.require_store)
    tables = _parallel(node_env, names, _dump, meanwhile=res.preload)
    now = now_coarse()
    total = sum(t.count for t in tables)
    shown = tables
    if args.limit is not None:
        left = args.limit
        shown = []
        for t in tables:
            take = min(left, t.count)
            shown.append(_take(t, take))
            left -= take
    n_shown = sum(t.count for t in shown)
    if args.output == "json":
        _write_json(inv, node_env, tables, shown, total, n_shown, now, res)
        return ExitStatus.OK
    _write_lines(inv, tables, shown, total, n_shown, now, res)
    return ExitStatus.OK


def _write_json(inv: Invocation, node_env: NodeEnv, tables: list[CtDump], shown: list[CtDump], total: int,
                n_shown: int, now: int, res: NumericResolver) -> None:
    head = {"node": node_env.node, "numeric": bool(res.numeric), "now_ns": now, "clock": "CLOCK_MONOTONIC_COARSE",
            "tables": [{"table": t.name, "count": t.count, "capacity": t.capacity} for t in tables],
            "count": total, "shown": n_shown, "truncated": n_shown < total}
    out = inv.stdout
    buf = getattr(out, "buffer", None)
    if buf is not None:  # bytes straight to the binary stream, no decode/encode
        out.flush()
        write = buf.write
    else:
        def write(b: Any) -> None:
            out.write(bytes(b).decode())
    write(orjson.dumps(head)[:-1] + b',"entries":[\n')
    first = True
    for t in shown:
        if not t.count:
            continue
        if not first:
            write(b",\n")
        first = False
        for body in json_rows(t, now, res).chunks():
            write(body)
    write(b"\n]}\n")
    if buf is not None:
        buf.flush()
    else:
        out.flush()


# ---- text --------------------------------------------------------------------------------------

def _ep(addr: str, port: int, family: int, proto: int) -> str:
    a = f"[{addr}]" if family == 6 else addr
    return a if proto in (Proto.ICMP, Proto.ICMPV6) else f"{a}:{port}"


def _bytes(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)


def entry_lines(t: CtDump, now: int, res: NumericResolver) -> list[str]:
    """One compact line per entry: proto, client -> [VIP ->] backend, network, state, direction,
    counters both ways, age and time left, flags."""
    from lace.cli.render import human_duration
    k, v = t.keys, t.vals
    if t.count == 0:
        return []
    saddr = C.ip(k["saddr"], t.family).tolist()
    daddr = C.ip(k["daddr"], t.family).tolist()
    nat_addr = C.ip(v["nat_addr"], t.family).tolist()
    net_names = {int(x): res.network(int(x)) for x in np.unique(k["network"]).tolist()}
    lines = []
    kl, vl = k.tolist(), v.tolist()
    kn, vn = k.dtype.names, v.dtype.names
    for i in range(t.count):
        kk = dict(zip(kn, kl[i]))
        vv = dict(zip(vn, vl[i]))
        proto = kk["proto"]
        src = _ep(saddr[i], kk["sport"], t.family, proto)
        dst = _ep(daddr[i], kk["dport"], t.family, proto)
        flags = vv["flags"]
        if flags & CtFlag.DNAT:
            tup = f"{src} → {_ep(nat_addr[i], vv['nat_port'], t.family, proto)} → {dst}"
        elif flags & CtFlag.SNAT:
            tup = f"{src} → {dst} (snat as {_ep(nat_addr[i], vv['nat_port'], t.family, proto)})"
        else:
            tup = f"{src} → {dst}"
        if not res.numeric:
            sp, dp = res.pod_for_ip(kk["network"], saddr[i]), res.pod_for_ip(kk["network"], daddr[i])
            if sp or dp:
                tup += f"  [{sp or '-'} → {dp or '-'}]"
        left = (vv["expires_ns"] - now) / 1e9
        age = max(0.0, (now - vv["created_ns"]) / 1e9)
        state = enum_label(CtState, vv["state"])
        deliv = enum_label(DeliveryKind, vv["delivery"])
        fl = ",".join(x for x in flag_labels(CtFlag, flags) if x not in ("dnat", "snat"))
        tcpf = ""
        if proto == Proto.TCP:
            tcpf = f" tcp {'/'.join(tcp_flag_labels(vv['tcp_flags_fwd'])) or '-'}|" \
                   f"{'/'.join(tcp_flag_labels(vv['tcp_flags_rev'])) or '-'}"
        lines.append(
            f"{enum_label(Proto, proto)!s:<5} {tup}  net {net_names[kk['network']]}  {state}  →{deliv}  "
            f"fwd {vv['packets_fwd']}p/{_bytes(vv['bytes_fwd'])} rev {vv['packets_rev']}p/{_bytes(vv['bytes_rev'])}  "
            f"age {human_duration(age)} "
            + (f"left {human_duration(left)}" if left > 0 else f"expired {human_duration(-left)} ago")
            + (f"  [{fl}]" if fl else "") + tcpf)
    return lines


def _write_lines(inv: Invocation, tables: list[CtDump], shown: list[CtDump], total: int, n_shown: int,
                 now: int, res: NumericResolver) -> None:
    from lace.cli.render import pressure
    out = inv.stdout
    for full, t in zip(tables, shown):
        if full.count == 0:
            continue
        if t.count:
            out.write(f"# {t.name}\n")
            out.write("\n".join(entry_lines(t, now, res)) + "\n")
    for t in tables:
        if t.count == 0:
            out.write(f"{t.name}: empty (capacity {t.capacity})\n")
        else:
            out.write(f"{t.name}: {pressure(t.count, t.capacity)}\n")
    if n_shown < total:
        out.write(f"showing {n_shown} of {total} entries (--limit)\n")
    elif len(tables) > 1:
        out.write(f"total: {total} entries\n")
    out.flush()


# ---- gc ----------------------------------------------------------------------------------------

def _gc(name: str, m: Any, now: int | None = None) -> dict[str, int]:
    """Delete the expired entries of one table from its open map ``m`` (closed here); the counts
    before, expired and removed."""
    with m:
        kb, vb, n = m.dump()
        now = now_coarse() if now is None else now
        vals = CT_ENTRY.decode_many(vb, n)
        expired = np.nonzero(vals["expires_ns"] <= np.uint64(now))[0]
        removed = 0
        if len(expired):
            ks = m.key_size
            keys = np.frombuffer(kb, dtype=np.uint8, count=n * ks).reshape(n, ks)
            removed = m.delete_batch(np.ascontiguousarray(keys[expired]), len(expired))  # one gather, no copy
        cap = m.max_entries
    return {"entries": n, "expired": int(len(expired)), "removed": removed, "remaining": n - removed,
            "capacity": cap}


def run_gc(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    names = tables_of(args.table)
    node_env = NodeEnv.from_env(inv.env)
    now = now_coarse()
    results = [{"table": name, **r} for name, r in
               zip(names, _parallel(node_env, names, lambda name, m: _gc(name, m, now)))]
    shown = results if args.limit is None else results[: args.limit]
    total = sum(r["removed"] for r in results)
    if args.output == "json":
        from lace.cli.render import write_json
        write_json(inv.stdout, {"node": node_env.node, "removed": total, "tables": shown})
        return ExitStatus.OK
    from lace.cli.render import node_table, plain_table
    headers = ["TABLE", "REMOVED", "REMAINING", "CAPACITY"]
    cells = [[r["table"], r["removed"], r["remaining"], r["capacity"]] for r in shown]
    out = inv.stdout
    if not plain_table(out, inv.env, headers, cells):
        con = inv.console()
        node_table(con, headers, cells)
        out = con.file
    out.write(f"removed {total} expired entr{'y' if total == 1 else 'ies'} from "
              f"{len(results)} table{'s' if len(results) != 1 else ''}\n")
    return ExitStatus.OK

