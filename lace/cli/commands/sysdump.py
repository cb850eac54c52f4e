"""``lace sysdump [-o FILE.tar.gz] [--node NODE…]``: one archive with every node's maps, conntrack,
flows, devices, agent status and metrics, the lab's logs, the store's objects and the lab's
topology, for offline analysis; secrets never included. What goes in: :mod:`lace.cli.sysdump`.

A node that is down (or a command that fails on it) is recorded in the archive's ``index.json``
under ``errors``; the rest is still collected and the exit status is 0. Exit 2: bad command line
(an unknown node, an output directory that does not exist); 5: no lab.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

from lace.cli import args as cli_args
from lace.cli.errors import UnavailableError, UsageError
from lace.cli.invocation import Invocation
from lace.cli.status import ExitStatus


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sysdump", help="one archive of every node's maps, conntrack, flows, devices, agent status, logs, "
                        "the store and the lab's topology (no secrets)",
        description="Collect everything needed to analyse the cluster offline into one .tar.gz: per node the "
                    "output of node bpf show (every map), node ct list all, node trace flow, node device list, "
                    "the agent's /v1/status and /metrics; the lab's logs, lab.json, procs.json and status; "
                    "every stored object (Secrets left out, secret-like values redacted). index.json lists "
                    "every file and every collection error (a node that is down is recorded, the rest "
                    "collected).")
    p.add_argument("-o", "--output", metavar="FILE.tar.gz", default=None,
                   help="the archive (default: lace-sysdump-<lab>-<time>.tar.gz here)")
    p.add_argument("--node", dest="nodes", action="append", metavar="NODE", help="only this node (repeatable)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="how long to wait for a node (default 120)")
    cli_args.add_lab_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    from lace.cli import sysdump
    from lace.lab import topology
    ctx = inv.lab(args)
    if not ctx.dir.is_dir():
        raise UnavailableError(f'lab "{ctx.name}" does not exist', hint="lace lab up")
    out = args.output or f"lace-sysdump-{ctx.name}-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz"
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise UsageError(f"-o {out}: directory {os.path.dirname(os.path.abspath(out))} does not exist")
    if args.timeout <= 0:
        raise UsageError("--timeout must be more than 0 seconds")
    lab = topology.load(ctx.name, state_dir=str(ctx.dir))
    if args.nodes:
        known = [n.name for n in lab.nodes] if lab is not None else []
        bad = [n for n in args.nodes if n not in known]
        if bad:
            raise UsageError(f'no node "{bad[0]}" in lab {ctx.name}', hint="nodes: " + ", ".join(known))
    store = inv.store(args)
    start = time.monotonic()

    def progress(msg: str) -> None:
        inv.stderr.write(f"[{time.monotonic() - start:5.1f}s] {msg}\n")
        inv.stderr.flush()
    top = os.path.basename(out)
    for suffix in (".tar.gz", ".tgz"):
        if top.endswith(suffix):
            top = top[: -len(suffix)]
    work = tempfile.mkdtemp(prefix="lace-sysdump-")
    try:
        root = os.path.join(work, top)
        os.makedirs(root)
        index = sysdump.Collector(root, ctx.name, str(ctx.dir), store, lab, progress,
                                  node_timeout=args.timeout).collect(args.nodes)
        sysdump.write_archive(root, out, top)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = os.path.getsize(out)
    inv.stdout.write(f"{out}: {len(index['files'])} files, {size / 1024:.0f} KiB, "
                     f"{len(index['errors'])} collection errors\n")
    for e in index["errors"]:
        inv.stdout.write(f"  {e.get('node', '-')}: {e['what']}: {e['error']}\n")
    return ExitStatus.OK
