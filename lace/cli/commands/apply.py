"""``lace apply -f FILE``: validate every object, then create/update them in one transaction."""

from __future__ import annotations

import argparse
from typing import Any

from lace.cli import args as cli_args
from lace.cli.errors import InvalidInputError, from_store_error
from lace.cli.invocation import Invocation
from lace.cli.manifests import Manifest, load_manifests
from lace.cli.render import list_document, object_name, write_document
from lace.cli.status import ExitStatus
from lace.store import ValidationError
from lace.store import kinds as K


def register(subparsers: Any) -> None:
    cli_args.define_apply(subparsers).set_defaults(handler=run)


def with_namespace(manifest: Manifest, namespace: str | None) -> Any:
    """Apply ``-n``: fill in the namespace of namespaced objects; refuse a contradicting one."""
    obj = manifest.obj
    if namespace is None or not isinstance(obj.get("metadata"), dict):
        return obj
    info = K.BY_KIND.get(obj.get("kind"))  # type: ignore[arg-type]
    if info is None or not info.namespaced:
        return obj
    have = obj["metadata"].get("namespace")
    if have and have != namespace:
        raise InvalidInputError(
            f'{manifest.source}: the object\'s namespace "{have}" does not match -n {namespace}',
            hint=f"drop -n, or pass -n {have}; nothing was written")
    obj = dict(obj)
    obj["metadata"] = {**obj["metadata"], "namespace": namespace}
    return obj


def run(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    manifests = load_manifests(args.filename, inv.stdin)
    objs = [with_namespace(m, args.namespace) for m in manifests]
    store = inv.store(args)
    try:
        results = store.apply_all(objs, dry_run=args.dry_run)
    except ValidationError as err:
        where = manifests[err.index].source if err.index is not None else None
        raise from_store_error(err, prefix=where) from None
    suffix = " (dry run)" if args.dry_run else ""
    if args.output in ("json", "yaml"):
        write_document(inv.stdout, list_document([r.object for r in results]), args.output)
    else:
        for r in results:
            inv.stdout.write(object_name(r.object) + ("" if args.output == "name" else f" {r.outcome}{suffix}")
                             + "\n")
    return ExitStatus.OK
