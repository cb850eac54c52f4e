"""``lace get KIND [NAME...]``: show objects as a table, JSON, YAML or names."""

from __future__ import annotations

import argparse
from typing import Any

from lace.cli import args as cli_args
from lace.cli.commands._targets import describe_scope, kind_and_names
from lace.cli.errors import UsageError
from lace.cli.invocation import Invocation
from lace.cli.render import (list_document, object_name, print_error, render_objects, write_document)
from lace.cli.status import ExitStatus
from lace.store import NotFound
from lace.store import kinds as K


def register(subparsers: Any) -> None:
    cli_args.define_get(subparsers).set_defaults(handler=run)


def run(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    if not args.kind:
        raise UsageError("say which kind of object to get",
                         hint="one of: " + ", ".join(k.plural for k in K.KINDS))
    info, names = kind_and_names(args.kind, args.names)
    if args.all_namespaces and args.namespace:
        raise UsageError("-A and -n exclude each other", hint="pass one of them")
    namespace: str | None = None
    if info.namespaced and not args.all_namespaces:
        namespace = args.namespace or "default"
    if names and args.selector:
        raise UsageError("names and -l selector exclude each other", hint="pass one of them")
    store = inv.store(args)
    status = ExitStatus.OK
    items: list[dict] = []
    resource_version = ""
    if names:
        if args.all_namespaces and info.namespaced:
            raise UsageError("a name needs one namespace, not -A", hint="pass -n NAMESPACE")
        for name in names:
            try:
                items.append(store.get(info.kind, name, namespace))
            except NotFound as err:
                print_error(inv.stderr, err.message, err.hint)
                status = ExitStatus.NOT_FOUND
    else:
        result = store.list(info.kind, namespace, args.selector)
        items, resource_version = result.items, result.resource_version
    if info.kind == "Node" and items:
        # readiness is the agents' liveness in the store, read now (lace.store.nodes)
        from lace.store.nodes import with_ready
        items = with_ready(items, store.node_liveness())
    if args.output in ("json", "yaml"):
        if len(names) == 1 and items:
            write_document(inv.stdout, items[0], args.output)
        elif items or not names:
            write_document(inv.stdout, list_document(items, resource_version), args.output)
        return status
    if not items:
        if not names:
            inv.stderr.write(f"No resources found{describe_scope(info, namespace)}.\n")
        return status
    if args.output == "name":
        inv.stdout.write("".join(object_name(o) + "\n" for o in items))
        return status
    render_objects(inv.console(), info.kind, items, wide=args.output == "wide",
                   all_namespaces=bool(args.all_namespaces))
    return status
