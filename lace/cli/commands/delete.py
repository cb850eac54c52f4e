"""``lace delete -f FILE`` / ``lace delete KIND NAME...``: delete objects, reporting each one."""

from __future__ import annotations

import argparse
from typing import Any

from lace.cli import args as cli_args
from lace.cli.commands._targets import kind_and_names
from lace.cli.errors import UsageError, from_store_error
from lace.cli.invocation import Invocation
from lace.cli.manifests import load_manifests
from lace.cli.render import print_error
from lace.cli.status import ExitStatus
from lace.store import NotFound, StoreError, ValidationError
from lace.store import kinds as K
from lace.store.validation import normalize


def register(subparsers: Any) -> None:
    cli_args.define_delete(subparsers).set_defaults(handler=run)


def _targets_from_files(args: argparse.Namespace, inv: Invocation) -> list[tuple[K.KindInfo, str, str | None]]:
    out = []
    for m in load_manifests(args.filename, inv.stdin):
        try:
            obj = normalize(m.obj)
        except ValidationError as err:
            raise from_store_error(err, prefix=m.source) from None
        info = K.kind_info(obj["kind"])
        ns = obj["metadata"].get("namespace")
        if args.namespace and info.namespaced and m.obj.get("metadata", {}).get("namespace") is None:
            ns = args.namespace
        out.append((info, obj["metadata"]["name"], ns))
    # dependents first: pods before their namespace and network
    out.sort(key=lambda t: -K.APPLY_ORDER[t[0].kind])
    return out


def run(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    if args.filename:
        if args.kind or args.names or args.selector or args.all:
            raise UsageError("-f cannot be combined with KIND, names, -l or --all")
        targets = _targets_from_files(args, inv)
    else:
        if not args.kind:
            raise UsageError("say what to delete: -f FILE, or KIND NAME...",
                             hint="e.g. `lace delete network blue` or `lace delete -f blue.yaml`")
        info, names = kind_and_names(args.kind, args.names)
        ns = (args.namespace or "default") if info.namespaced else None
        if names and (args.selector or args.all):
            raise UsageError("names cannot be combined with -l or --all")
        if not names:
            if not (args.selector or args.all):
                raise UsageError(f"say which {info.plural} to delete: NAME..., -l SELECTOR or --all")
            store = inv.store(args)
            names = [o["metadata"]["name"] for o in store.list(info.kind, ns, args.selector).items]
            if not names:
                inv.stderr.write("No resources found" + (f" in {ns} namespace" if ns else "") + ".\n")
                return ExitStatus.OK
        targets = [(info, name, ns) for name in names]
    store = inv.store(args)
    status = ExitStatus.OK
    for info, name, ns in targets:
        try:
            obj = store.delete(info.kind, name, ns)
        except NotFound as err:
            if args.ignore_not_found:
                continue
            print_error(inv.stderr, err.message, err.hint)
            status = max(status, ExitStatus.NOT_FOUND) if status != ExitStatus.OK else ExitStatus.NOT_FOUND
            continue
        except StoreError as err:
            cli_err = from_store_error(err)
            print_error(inv.stderr, cli_err.message, cli_err.hint)
            status = cli_err.status
            continue
        if args.output == "name":
            inv.stdout.write(f"{info.qualified_singular}/{name}\n")
        else:
            inv.stdout.write(f'{info.qualified_singular} "{obj["metadata"]["name"]}" deleted\n')
    return status
