"""Shared by get/delete: turn ``KIND [NAME...]`` / ``KIND/NAME`` arguments into a kind and names."""

from __future__ import annotations

from lace.cli.errors import UsageError
from lace.store import kinds as K


def kind_and_names(kind_arg: str, names: list[str]) -> tuple[K.KindInfo, list[str]]:
    """``pods web db`` or ``pod/web`` → (KindInfo of Pod, [names]); unknown kinds raise UnknownKind."""
    if "/" in kind_arg:
        if names:
            raise UsageError(f'"{kind_arg}" already names an object; do not add more names after it',
                             hint="use either KIND NAME... or KIND/NAME")
        kind_name, _, name = kind_arg.partition("/")
        if not name:
            raise UsageError(f'"{kind_arg}" has no name after "/"')
        return K.resolve_kind(kind_name), [name]
    return K.resolve_kind(kind_arg), list(names)


def describe_scope(info: K.KindInfo, namespace: str | None) -> str:
    """``in demo namespace`` / `` `` for kubectl's "No resources found" message."""
    if info.namespaced and namespace is not None:
        return f" in {namespace} namespace"
    return ""
