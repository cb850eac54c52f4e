"""Command modules. Each module here exposes ``register(subparsers)``, which adds its subcommands
with ``set_defaults(handler=fn)``; ``fn(args, inv) -> ExitStatus``. Dropping a module into this
package is all it takes to add a command (``lab``, ``exec``, ``policy`` come from their owners)."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

# Shown first in `lace --help`, in this order; other modules follow alphabetically.
FIRST = ("apply", "get", "delete")


def command_modules() -> list[ModuleType]:
    """Every command module of this package that has a ``register`` function."""
    names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    names.sort(key=lambda n: (FIRST.index(n) if n in FIRST else len(FIRST), n))
    modules = [importlib.import_module(f"{__name__}.{n}") for n in names]
    return [m for m in modules if callable(getattr(m, "register", None))]
