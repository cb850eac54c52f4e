"""Where the node's state lives: pin root, store, node name and agent socket, from the environment.

``lace exec --node N -- node ...`` sets ``LACE_PIN_ROOT``, ``LACE_STORE``, ``LACE_NODE`` and
``LACE_AGENT_SOCKET``; in a lace-node pod the DaemonSet sets them.  Each is checked only when a
command needs it, and a missing one is an error that says which variable to set.

Maps are opened through :class:`lace.datapath.node.PinnedMaps` by CLI name; its typed errors
(node not loaded, map not pinned, map unavailable) become the CLI's messages here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from lace.bpf import Map
from lace.cli.errors import NotFoundError, UnavailableError, UsageError
from lace.datapath.node import MapNotPinned, MapUnavailable, NodeNotLoaded, PinnedMaps

ENV_PIN_ROOT = "LACE_PIN_ROOT"
ENV_STORE = "LACE_STORE"
ENV_NODE = "LACE_NODE"
ENV_AGENT_SOCKET = "LACE_AGENT_SOCKET"

_HINT_EXEC = "run it as `lace exec --node NODE -- node ...`, which sets it"


@dataclasses.dataclass(frozen=True)
class NodeEnv:
    """The node a ``node`` command inspects (any field may be None until a command needs it)."""

    pin_root: str | None
    store_path: str | None
    node: str | None
    agent_socket: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NodeEnv:
        return cls(env.get(ENV_PIN_ROOT) or None, env.get(ENV_STORE) or None,
                   env.get(ENV_NODE) or None, env.get(ENV_AGENT_SOCKET) or None)

    @property
    def node_name(self) -> str:
        """The node's name for messages (``this node`` when LACE_NODE is unset)."""
        return self.node or "this node"

    def maps(self) -> PinnedMaps:
        """The node's pinned maps (``lace.datapath.node``), once LACE_PIN_ROOT is known."""
        if not self.pin_root:
            raise UsageError(f"{ENV_PIN_ROOT} is not set: the node's bpffs pin root is unknown", hint=_HINT_EXEC)
        return PinnedMaps(self.pin_root, self.node)

    def map_path(self, cli_name: str) -> str:
        """Where map ``cli_name`` is pinned on this node."""
        return self.maps().path(cli_name)

    def open_map(self, cli_name: str) -> Map:
        """Open pinned map ``cli_name`` (the caller closes it); the facade's errors become the CLI's,
        naming the map, the node and the path."""
        try:
            return self.maps().open(cli_name)
        except NodeNotLoaded:
            raise UnavailableError(
                f"pin root {self.pin_root} ({ENV_PIN_ROOT}) of {self.node_name} does not exist",
                hint="the datapath was never loaded on this node: is its agent running? (lace lab status)") from None
        except MapNotPinned as exc:
            raise NotFoundError(f"map {cli_name} is not pinned on {self.node_name} ({exc.path})",
                                hint="the datapath objects were not loaded here; restart the agent") from None
        except MapUnavailable as exc:
            raise UnavailableError(f"cannot open map {cli_name} at {exc.path}: {exc.cause}") from None

    def require_store(self) -> str:
        """The store's spec: a path checked to be an existing, readable file (never created
        here), or an ``etcd://`` or ``k8s://`` spec as it is (a lace-node pod's is ``k8s://``)."""
        if not self.store_path:
            raise UsageError(f"{ENV_STORE} is not set: names cannot be resolved",
                             hint="set it, or pass -n/--numeric to print raw IDs without the store")
        path = self.store_path
        if path.startswith(("etcd://", "k8s://", "kubernetes://")):
            return path
        if not os.path.isfile(path):
            raise UnavailableError(f"the store {path} ({ENV_STORE}) does not exist or is not a file",
                                   hint="pass -n/--numeric to print raw IDs without the store")
        if not os.access(path, os.R_OK):
            raise UnavailableError(f"the store {path} is not readable",
                                   hint="pass -n/--numeric to print raw IDs without the store")
        return path

    def require_agent_socket(self) -> str:
        if not self.agent_socket:
            raise UsageError(f"{ENV_AGENT_SOCKET} is not set: the agent of {self.node_name} cannot be reached",
                             hint=_HINT_EXEC)
        return self.agent_socket

    def restart_hint(self) -> str:
        """What to do about an agent that does not answer."""
        return f"restart it: lace lab restart-agent {self.node}" if self.node else "restart the node's agent"

    def get_agent(self, path: str, timeout: float) -> tuple[int, object]:
        """``GET path`` on the node's agent: (status, body); an agent that does not answer is an
        UnavailableError naming the node and its socket."""
        from lace.cni.client import AgentUnavailable, call
        sock = self.require_agent_socket()
        try:
            return call(sock, "GET", path, timeout=timeout)
        except AgentUnavailable as exc:
            raise UnavailableError(f"the agent of {self.node_name} is not answering on {sock}: "
                                   f"{str(exc).rpartition('is not answering: ')[2]}",
                                   hint=self.restart_hint()) from None
