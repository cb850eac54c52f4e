"""Which store a process opens, as one spec string: ``open_store`` picks the backend from it.

Every component that opens the store (agents, controllers, the lab kubelet and DNS feed, the
CLI) takes the same spec, so choosing etcd over the embedded SQLite file is configuration, not
code:

- ``PATH`` or ``sqlite:PATH`` — the embedded SQLite store, one file (the default; a lab's is
  ``<state dir>/store.db``);
- ``etcd://HOST:PORT[,HOST:PORT...][/PREFIX][?netns=NAME]`` — an etcd v3 cluster: its members'
  client endpoints, the key prefix (default ``/lace``), and the network namespace the client's
  sockets are made in (a process outside the lab reaches the lab's etcd without it listening
  anywhere else);
- ``k8s://[CONTEXT][?kubeconfig=PATH&namespace=NS&netns=NAME]`` — a Kubernetes cluster
  (``kubernetes.py``): the kubeconfig context (default: the current one; inside a pod with no
  context and no kubeconfig, the pod's service account), lace's own namespace for its counters and
  liveness Leases (default ``lace-system``) and, as for etcd, the network namespace client sockets
  are made in.

The backend also says who runs which controllers (``StoreConfig.platform``): on Kubernetes the
apiserver allocates ClusterIPs and NodePorts and the controller manager writes EndpointSlices, so
lace's own allocators for Services and its EndpointSlice controller run only in the lab.

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

BACKENDS = ("sqlite", "etcd", "k8s")
#: in a lab's state directory: the spec of its store when it is not the ``store.db`` beside it
SPEC_FILE = "store.spec"
DEFAULT_ETCD_PREFIX = "/lace"
DEFAULT_K8S_NAMESPACE = "lace-system"
#: ``StoreConfig.platform``: lace is the API (the lab), or Kubernetes is
PLATFORM_LAB = "lab"
PLATFORM_KUBERNETES = "kubernetes"


@dataclass(frozen=True)
class StoreConfig:
    """A parsed store spec: the backend and what it needs to open it."""

    backend: str
    path: str = ""
    endpoints: tuple[str, ...] = ()
    prefix: str = DEFAULT_ETCD_PREFIX
    netns: str | None = None
    #: k8s: the kubeconfig context ("" = current / in-cluster), kubeconfig file, lace's namespace
    context: str = ""
    kubeconfig: str | None = None
    namespace: str = DEFAULT_K8S_NAMESPACE

    @property
    def platform(self) -> str:
        """Who owns Services' addresses and EndpointSlices: ``kubernetes`` (the apiserver and the
        controller manager) or ``lab`` (lace's allocators and its EndpointSlice controller)."""
        return PLATFORM_KUBERNETES if self.backend == "k8s" else PLATFORM_LAB

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
        if text.startswith(("k8s://", "kubernetes://")):
            url = urllib.parse.urlsplit(text)
            query = urllib.parse.parse_qs(url.query)
            unknown = set(query) - {"kubeconfig", "namespace", "netns"}
            if unknown or url.path.strip("/"):
                what = f'unknown option(s) {", ".join(sorted(unknown))}' if unknown else f'"{url.path}"'
                raise StoreError(f'store spec "{text}": {what}',
                                 hint="write k8s://[CONTEXT][?kubeconfig=PATH&namespace=NS&netns=NAME]")
            return cls("k8s", context=urllib.parse.unquote(url.netloc),
                       kubeconfig=query["kubeconfig"][-1] if "kubeconfig" in query else None,
                       namespace=query["namespace"][-1] if "namespace" in query else DEFAULT_K8S_NAMESPACE,
                       netns=query["netns"][-1] if "netns" in query else None)
        if text.startswith("sqlite:"):
            text = text[len("sqlite:"):]
        if not text or "://" in text:
            raise StoreError(f'"{text}" is not a store spec',
                             hint="give a SQLite file path, etcd://HOST:PORT[/PREFIX][?netns=NAME] "
                                  "or k8s://[CONTEXT][?kubeconfig=PATH]")
        return cls("sqlite", path=text)

    def __str__(self) -> str:
        if self.backend == "sqlite":
            return self.path
        if self.backend == "k8s":
            query = {k: v for k, v in (("kubeconfig", self.kubeconfig), ("namespace", self.namespace),
                                       ("netns", self.netns))
                     if v is not None and not (k == "namespace" and v == DEFAULT_K8S_NAMESPACE)}
            return f"k8s://{urllib.parse.quote(self.context, safe='')}" + (
                "?" + urllib.parse.urlencode(query, safe="/") if query else "")
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
        if self.backend == "k8s":
            return (f"the Kubernetes cluster of context {self.context}" if self.context
                    else "the Kubernetes cluster of the current context (or in-cluster)")
        where = f"etcd at {', '.join(self.endpoints)} (prefix {self.prefix})"
        return where + (f" from network namespace {self.netns}" if self.netns else "")


def open_store(config: StoreConfig | str | os.PathLike[str], *,
               poll_interval: float | None = None) -> Store:
    """The Store a spec names: SqliteStore for a path, EtcdStore for ``etcd://``,
    KubernetesStore for ``k8s://``.

    ``poll_interval`` is the SQLite watch's polling period (an etcd watch is pushed to, it has
    none).
    """
    cfg = config if isinstance(config, StoreConfig) else StoreConfig.parse(config)
    if cfg.backend == "k8s":
        from lace.store.kubernetes import open_kubernetes
        return open_kubernetes(kubeconfig=cfg.kubeconfig, context=cfg.context or None,
                               namespace=cfg.namespace, netns=cfg.netns)
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
