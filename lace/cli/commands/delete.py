"""``lace delete -f FILE`` / ``lace delete KIND NAME...``: delete objects, reporting each one.

As ``kubectl delete``: a pod that a kubelet runs is deleted gracefully (the store marks it
terminating, its kubelet stops it and removes it) and the command waits until it is gone, up to
its grace period and 30 s more; ``--grace-period N`` sets the wait the kubelet grants the pod,
``--force`` (or ``--grace-period 0``) removes the object at once, ``--wait=false`` returns as soon
as the deletion is asked for.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from lace.cli import args as cli_args
from lace.cli.commands._targets import kind_and_names
from lace.cli.errors import UnavailableError, UsageError, from_store_error
from lace.cli.invocation import Invocation
from lace.cli.manifests import load_manifests
from lace.cli.render import print_error
from lace.cli.status import ExitStatus
from lace.store import NotFound, Store, StoreError, ValidationError
from lace.store import kinds as K
from lace.store.validation import normalize

#: how much longer than its grace period ``lace delete`` waits for a pod to be gone
WAIT_MARGIN = 30.0


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "yes", "1"):
        return True
    if value in ("false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def register(subparsers: Any) -> None:
    p = cli_args.define_delete(subparsers)
    p.add_argument("--grace-period", type=int, default=-1, metavar="SECONDS",
                   help="seconds a pod's kubelet gets to stop it (default -1: the pod's "
                        "terminationGracePeriodSeconds, else 30; 0: at once)")
    p.add_argument("--force", action="store_true",
                   help="remove the objects at once, without waiting for a kubelet (grace period 0)")
    p.add_argument("--wait", type=_bool, nargs="?", const=True, default=True, metavar="BOOL",
                   help="wait until gracefully deleted pods are gone (default true)")
    p.set_defaults(handler=run)


def _wait_gone(store: Store, obj: dict, kind: str) -> None:
    """Until ``obj`` (marked for deletion) is no longer stored, or its wait is over."""
    meta = obj["metadata"]
    limit = float(meta.get("deletionGracePeriodSeconds") or 0) + WAIT_MARGIN
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if store.get(kind, meta["name"], meta.get("namespace"))["metadata"].get("uid") != meta.get("uid"):
                return
        except NotFound:
            return
        time.sleep(0.05)
    raise UnavailableError(f'{kind} "{meta["name"]}" is still terminating after {limit:.0f}s: '
                           "no kubelet has removed it",
                           hint="check that the lab's kubelet runs (lace lab status), or delete it with --force")


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
    if args.grace_period < -1:
        raise UsageError(f"--grace-period {args.grace_period} is negative", hint="use -1 (the default), 0 or more")
    grace = 0 if args.force else (None if args.grace_period < 0 else args.grace_period)
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
            obj = store.delete(info.kind, name, ns, grace_period=grace)
            if args.wait and obj["metadata"].get("deletionTimestamp"):
                _wait_gone(store, obj, info.kind)
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
        except UnavailableError as err:
            print_error(inv.stderr, err.message, err.hint)
            status = err.status
            continue
        if args.output == "name":
            inv.stdout.write(f"{info.qualified_singular}/{name}\n")
        else:
            inv.stdout.write(f'{info.qualified_singular} "{obj["metadata"]["name"]}" deleted\n')
    return status
