"""The rule for a lab's name, in one place: every name the lab derives from it (namespaces such as
``lace-<lab>-worker-16``, interfaces, the bpffs pin root, the cgroup) must stay within the kernel's
limits, which caps a lab name at 10 characters. Stdlib only: the CLI checks ``--lab`` with it."""

from __future__ import annotations

import re

MAX_NAME = 10

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a lab (one line naming it and the fix), or None when it can."""
    if isinstance(name, str) and _LABEL.match(name) and len(name) <= MAX_NAME:
        return None
    return (f"invalid lab name {name!r}: use 1-{MAX_NAME} lowercase letters, digits and '-', "
            "starting and ending with a letter or digit")
