"""Which store a process opens, as one spec string: ``open_store`` picks the backend from it.

Every component that opens the store (agents, controllers, the lab kubelet and DNS feed, the
CLI) takes the same spec, so choosing etcd over the embedded SQLite file is configuration, not
code:

- ``PATH`` or ``sqlite:PATH`` — the embedded SQLite store, one file (the default; a lab's is
  ``<state dir>/store.db``);
- ``etcd://HOST:PORT[,HOST:PORT...][/PREFIX][?netns=NAME]`` — an etcd v3 cluster: its members'
  client endpoints, the key prefix (default ``/lace``), and the network namespace the client's
  sockets are made in (a process outside the lab reaches the lab's etcd without it listening
  anywhere else).

A lab's state directory says which store the lab has: the spec in its ``store.spec`` file
(written by ``lace lab up --store etcd``), else its ``store.db`` (``lab_store``).

Stdlib only until a store is opened: the CLI parses specs on every command.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lace.store import STORE_FILE
from lace.store.errors import StoreError

if TYPE_CHECKING:
    from lace.store.api import Store

BACKENDS = ("sqlite", "etcd")
#: in a lab's state directory: the spec of its store when it is not the ``store.db`` beside it
SPEC_FILE = "store.spec"
DEFAULT_ETCD_PREFIX = "/lace"


@dataclass(frozen=True)
class StoreConfig:
    """A parsed store spec: the backend and what it needs to open it."""

    backend: str
    path: str = ""
    endpoints: tuple[str, ...] = ()
    prefix: str = DEFAULT_ETCD_PREFIX
    netns: str | None = None

    @classmethod
    def parse(cls, spec: str | os.PathLike[str]) -> StoreConfig:
        text = os.fspath(spec)
        if text.startswith("etcd://"):
            url = urllib.parse.urlsplit(text)
            endpoints = tuple(e for e in url.netloc.split(",") if e)
            if not endpoints:
                raise StoreError(f'store spec "{text}" names no etcd endpoint',
                                 hint="write etcd://HOST:PORT[,HOST:PORT...][/PREFIX][?netns=NAME]")
            query = urllib.parse.parse_qs(url.query)
            unknown = set(query) - {"netns"}
            if unknown:
                raise StoreError(f'store spec "{text}": unknown option(s) {", ".join(sorted(unknown))}',
                                 hint="the only option is netns=NAME")
            prefix = url.path.rstrip("/") or DEFAULT_ETCD_PREFIX
            return cls("etcd", endpoints=endpoints, prefix=prefix,
                       netns=query["netns"][-1] if "netns" in query else None)
        if text.startswith("sqlite:"):
            text = text[len("sqlite:"):]
        if not text or "://" in text:
            raise StoreError(f'"{text}" is not a store spec',
                             hint="give a SQLite file path or etcd://HOST:PORT[/PREFIX][?netns=NAME]")
        return cls("sqlite", path=text)

    def __str__(self) -> str:
        if self.backend == "sqlite":
            return self.path
        spec = f"etcd://{','.join(self.endpoints)}{self.prefix}"
        return spec + (f"?netns={self.netns}" if self.netns else "")

    def without_netns(self) -> StoreConfig:
        """The same store for a process already inside a namespace that reaches it (a lab node's
        agent): its sockets are made where it runs."""
        return dataclasses.replace(self, netns=None)

    def describe(self) -> str:
        """A phrase for messages: where this store is."""
        if self.backend == "sqlite":
            return f"the SQLite store {self.path}"
        where = f"etcd at {', '.join(self.endpoints)} (prefix {self.prefix})"
        return where + (f" from network namespace {self.netns}" if self.netns else "")


def open_store(config: StoreConfig | str | os.PathLike[str], *,
               poll_interval: float | None = None) -> Store:
    """The Store a spec names: SqliteStore for a path, EtcdStore for ``etcd://``.

    ``poll_interval`` is the SQLite watch's polling period (an etcd watch is pushed to, it has
    none).
    """
    cfg = config if isinstance(config, StoreConfig) else StoreConfig.parse(config)
    if cfg.backend == "etcd":
        from lace.store.etcd import EtcdStore
        return EtcdStore(list(cfg.endpoints), prefix=cfg.prefix, netns=cfg.netns)
    from lace.store.embedded import SqliteStore
    if poll_interval is None:
        return SqliteStore(cfg.path)
    return SqliteStore(cfg.path, poll_interval=poll_interval)


def lab_store(state_dir: str | os.PathLike[str]) -> StoreConfig:
    """The store of a lab's state directory: the spec in its ``store.spec``, else its ``store.db``."""
    try:
        with open(os.path.join(state_dir, SPEC_FILE)) as f:
            return StoreConfig.parse(f.read().strip())
    except FileNotFoundError:
        return StoreConfig("sqlite", path=os.path.join(os.fspath(state_dir), STORE_FILE))


def write_lab_store(state_dir: str | os.PathLike[str], config: StoreConfig) -> None:
    """Record ``config`` as the store of a lab's state directory (atomically)."""
    path = os.path.join(state_dir, SPEC_FILE)
    with open(path + ".tmp", "w") as f:
        f.write(str(config) + "\n")
    os.replace(path + ".tmp", path)
