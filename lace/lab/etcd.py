"""etcd members for a lab (``lace lab up --store etcd``) and for the store tests: how one is started.

A member listens only inside the network namespace it runs in (a lab node's, or a test's own),
never in the root namespace: clients outside enter that namespace for their sockets
(``lace.store.etcd``, ``netns=``). The limits are raised over etcd's defaults because one lace
transaction is one etcd Txn: a namespace deletion cascading to many pods, or an apply of many
objects, is one Txn of that many operations (etcd's default allows 128). Old revisions are
compacted by etcd itself, keeping the last ``RETENTION`` like the SQLite store's event log.

Stdlib only (the CLI imports the lab on every lab command).
"""

from __future__ import annotations

from dataclasses import dataclass

CLIENT_PORT = 2379
PEER_PORT = 2380
MAX_TXN_OPS = 16384
MAX_REQUEST_BYTES = 32 * 1024 * 1024
RETENTION = 10_000
ETCD_BINARY = "etcd"


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True)
class Member:
    """One member: its name, the address it serves clients and peers on, and its data directory."""

    name: str
    address: str
    data_dir: str

    @property
    def client_url(self) -> str:
        return url(self.address, CLIENT_PORT)

    @property
    def peer_url(self) -> str:
        return url(self.address, PEER_PORT)


def member_argv(member: Member, cluster: list[Member], *, token: str,
                binary: str = ETCD_BINARY) -> list[str]:
    """The command line of ``member`` in a new cluster of ``cluster`` (itself included)."""
    initial = ",".join(f"{m.name}={m.peer_url}" for m in cluster)
    return [
        binary, "--name", member.name, "--data-dir", member.data_dir,
        "--listen-client-urls", member.client_url, "--advertise-client-urls", member.client_url,
        "--listen-peer-urls", member.peer_url, "--initial-advertise-peer-urls", member.peer_url,
        "--initial-cluster", initial, "--initial-cluster-state", "new",
        "--initial-cluster-token", token,
        "--max-txn-ops", str(MAX_TXN_OPS), "--max-request-bytes", str(MAX_REQUEST_BYTES),
        "--auto-compaction-mode", "revision", "--auto-compaction-retention", str(RETENTION),
    ]
