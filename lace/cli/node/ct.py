"""``node ct list TABLE`` and ``node ct gc TABLE``: live conntrack entries, and removing expired ones.

TABLE is ``all`` or one of ct-{tcp,udp,icmp}-{v6,v4}.  Entry times are CLOCK_MONOTONIC_COARSE
nanoseconds (``bpf_ktime_get_coarse_ns``), compared with the same clock here.

A node can hold a million entries, so both commands work on whole columns: the dump is one batch
syscall sequence, decoding is ``Layout.decode_many`` (NumPy), ``-o json`` is assembled by
:mod:`lace.textcols` without a Python object per entry (:mod:`~lace.cli.node.ct_json`; the lines
are :mod:`~lace.cli.node.ct_text`'s), and gc deletes in batches.  Names (networks, segments, pods,
services) are resolved once per distinct value, not per entry.

gc removes only entries whose expiry is in the past at the moment of the dump; an entry refreshed
by a packet between the dump and the delete (milliseconds) is removed too and re-created by its
next packet, which is what an LRU eviction would do to it anyway.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from lace.cli import render
from lace.cli.errors import UsageError
from lace.cli.invocation import Invocation
from lace.cli.node import ct_json, ct_text
from lace.cli.node.ct_dump import dump_table, keep_freed_memory, take
from lace.cli.node.env import NodeEnv
from lace.cli.node.resolve import for_node
from lace.cli.status import ExitStatus
from lace.datapath import registry
from lace.datapath.common import now_coarse
from lace.datapath.conntrack import CT_ENTRY

TABLES = ("all", *registry.CT_TABLES)


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


#: tables dumped (or collected) at once: a batch lookup runs in the kernel without the GIL, so
#: two threads use both cores of a small node
WORKERS = 2


def _parallel(node_env: NodeEnv, names: tuple[str, ...], work: Callable[[str, Any], Any],
              meanwhile: Callable[[], None] | None = None) -> list[Any]:
    """``work(name, map)`` for every table on WORKERS threads, largest capacity first, results in
    ``names`` order.  Maps are opened here first, so a missing one fails as it always did; and
    ``meanwhile`` (loading the store) runs on this thread while the kernel works."""
    maps = [node_env.open_map(name) for name in names]
    if len(names) == 1:
        if meanwhile is not None:
            meanwhile()
        return [work(names[0], maps[0])]
    order = sorted(range(len(names)), key=lambda i: -maps[i].max_entries)
    with ThreadPoolExecutor(WORKERS) as ex:
        futs = {i: ex.submit(work, names[i], maps[i]) for i in order}
        if meanwhile is not None:
            meanwhile()
        return [futs[i].result() for i in range(len(names))]

# ---- list --------------------------------------------------------------------------------------

def run_list(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    names = tables_of(args.table)
    node_env = NodeEnv.from_env(inv.env)
    keep_freed_memory()
    res = for_node(args.numeric, node_env.require_store)
    tables = _parallel(node_env, names, dump_table, meanwhile=res.preload)
    now = now_coarse()
    total = sum(t.count for t in tables)
    shown = tables
    if args.limit is not None:
        left = args.limit
        shown = []
        for t in tables:
            count = min(left, t.count)
            shown.append(take(t, count))
            left -= count
    n_shown = sum(t.count for t in shown)
    if args.output == "json":
        ct_json.write(inv.stdout, node_env.node, tables, shown, total, n_shown, now, res)
        return ExitStatus.OK
    ct_text.write(inv.stdout, tables, shown, total, n_shown, now, res)
    return ExitStatus.OK


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
        render.write_json(inv.stdout, {"node": node_env.node, "removed": total, "tables": shown})
        return ExitStatus.OK
    headers = ["TABLE", "REMOVED", "REMAINING", "CAPACITY"]
    cells = [[r["table"], r["removed"], r["remaining"], r["capacity"]] for r in shown]
    out = inv.stdout
    if not render.plain_table(out, inv.env, headers, cells):
        con = inv.console()
        render.node_table(con, headers, cells)
        out = con.file
    out.write(f"removed {total} expired entr{'y' if total == 1 else 'ies'} from "
              f"{len(results)} table{'s' if len(results) != 1 else ''}\n")
    return ExitStatus.OK
