"""Which lab (cluster) a command talks to, like a kubectl context.

The state dir is ``$LACE_STATE_DIR`` or ``/var/lib/lace``. Each lab lives in ``<state>/labs/<name>/``
with its ``store.db`` (or, for a lab on etcd, a ``store.spec`` naming it); ``<state>/current`` names the lab ``lace lab up`` created last. ``--lab NAME``
or ``LACE_LAB=NAME`` selects another one.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lace.cli.errors import NotFoundError, UnavailableError, UsageError
from lace.store import STORE_FILE

if TYPE_CHECKING:
    from lace.store.config import StoreConfig
from lace.lab.names import name_problem

DEFAULT_STATE_DIR = "/var/lib/lace"


@dataclasses.dataclass(frozen=True)
class LabContext:
    """A selected lab: its name, directory and store file."""

    name: str
    dir: Path
    store_path: Path

    def store_config(self) -> StoreConfig:
        """The lab's store: its ``store.db``, or the etcd its ``store.spec`` names."""
        from lace.store.config import lab_store
        return lab_store(self.dir)


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$LACE_STATE_DIR`` or /var/lib/lace."""
    env = os.environ if env is None else env
    return Path(env.get("LACE_STATE_DIR") or DEFAULT_STATE_DIR)


def check_lab_name(name: str) -> str:
    """Reject names that cannot name a lab (lace.lab.names) before they name a directory."""
    problem = name_problem(name)
    if problem:
        raise UsageError(problem)
    return name


def lab_context(name: str, env: Mapping[str, str] | None = None) -> LabContext:
    """The LabContext of ``name`` (whether or not it exists)."""
    directory = state_dir(env) / "labs" / check_lab_name(name)
    return LabContext(name, directory, directory / STORE_FILE)


def list_labs(env: Mapping[str, str] | None = None) -> list[str]:
    """Names of the labs that have a directory under the state dir."""
    labs = state_dir(env) / "labs"
    try:
        return sorted(p.name for p in labs.iterdir() if p.is_dir())
    except OSError:
        return []


def current_lab(env: Mapping[str, str] | None = None) -> str | None:
    """The lab named by ``<state>/current``, or None."""
    try:
        name = (state_dir(env) / "current").read_text().strip()
    except OSError:
        return None
    return name or None


def set_current(name: str, env: Mapping[str, str] | None = None) -> None:
    """Make ``name`` the current lab (atomically replaces ``<state>/current``)."""
    root = state_dir(env)
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".current.")
    with os.fdopen(fd, "w") as f:
        f.write(check_lab_name(name) + "\n")
    os.replace(tmp, root / "current")


def clear_current(name: str, env: Mapping[str, str] | None = None) -> None:
    """Forget ``name`` as the current lab (for ``lab down``); other labs are left alone."""
    if current_lab(env) == name:
        try:
            (state_dir(env) / "current").unlink()
        except FileNotFoundError:
            pass


def resolve_lab(args: Any, env: Mapping[str, str]) -> LabContext:
    """The lab a command targets: ``--lab``, else ``$LACE_LAB``, else the current one.

    Errors say what to do when no lab exists or the named one is gone.
    """
    name = getattr(args, "lab", None) or env.get("LACE_LAB") or None
    source = "--lab" if getattr(args, "lab", None) else ("LACE_LAB" if name else None)
    if name is None:
        name = current_lab(env)
        if name is None:
            raise UnavailableError("no lab is running: run `lace lab up`",
                                   hint=f"or select one with --lab NAME (state dir {state_dir(env)})")
        source = f"{state_dir(env) / 'current'}"
    ctx = lab_context(name, env)
    if not ctx.dir.is_dir():
        others = list_labs(env)
        raise NotFoundError(
            f'lab "{name}" (from {source}) does not exist under {state_dir(env) / "labs"}',
            hint=("existing labs: " + ", ".join(others)) if others else "run `lace lab up` to create one")
    return ctx
