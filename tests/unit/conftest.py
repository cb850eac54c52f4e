"""The store fixtures: one suite, run against every backend (SQLite, and a real etcd).

``store`` and ``store_factory`` are parametrized over the backends, so a test that asks for them
runs once per backend. The etcd runs are privileged: etcd runs in a network namespace made for the
test session (its ``lo`` only — it listens nowhere else, certainly not in the root namespace), and
the store's client sockets are made in that namespace (``EtcdStore(netns=...)``). Each test gets
its own key prefix in that one etcd, so tests do not see each other's objects; the namespace, the
process and its data are removed when the session ends, failed or not.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from lace.lab import etcd as lab_etcd
from lace.store import Store, StoreConfig, open_store

_prefixes = itertools.count()


@dataclass(frozen=True)
class EtcdServer:
    """A single-member etcd in its own network namespace."""

    netns: str
    endpoint: str
    process: subprocess.Popen[bytes]
    log_path: str


def _log_tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    if os.geteuid() != 0:
        pytest.skip("the etcd store tests run etcd in a network namespace of their own: needs root")
    if shutil.which(lab_etcd.ETCD_BINARY) is None:
        pytest.skip("etcd is not installed (`make install` installs Debian's etcd-server)")
    from lace.store.etcd import wait_ready

    netns = f"lace-store-test-{os.getpid()}"
    data_root = tempfile.mkdtemp(prefix="lace-etcd-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    log_path = os.path.join(data_root, "etcd.log")
    member = lab_etcd.Member("store-test", "127.0.0.1", os.path.join(data_root, "data"))
    proc: subprocess.Popen[bytes] | None = None
    subprocess.run(["ip", "netns", "add", netns], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True, capture_output=True)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", netns,
                 *lab_etcd.member_argv(member, [member], token=netns)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def exited() -> str | None:
            if proc.poll() is None:
                return None
            return f"exit status {proc.returncode}:\n{_log_tail(log_path)}"

        wait_ready([member.client_url], netns=netns, timeout=30, alive=exited)
        yield EtcdServer(netns, member.client_url, proc, log_path)
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        subprocess.run(["ip", "netns", "del", netns], check=False, capture_output=True)
        shutil.rmtree(data_root, ignore_errors=True)


@pytest.fixture
def etcd_config(request: pytest.FixtureRequest) -> StoreConfig:
    """A fresh store on the session's etcd: its own key prefix."""
    server: EtcdServer = request.getfixturevalue("etcd_server")
    endpoint = server.endpoint.removeprefix("http://")
    return StoreConfig("etcd", endpoints=(endpoint,), prefix=f"/test-{os.getpid()}-{next(_prefixes)}",
                       netns=server.netns)


@dataclass
class StoreFactory:
    """Opens stores on one backend's storage: every call another client of the same data."""

    backend: str
    config: StoreConfig
    opened: list[Store]

    def __call__(self) -> Store:
        store = open_store(self.config)
        self.opened.append(store)
        return store

    @property
    def spec(self) -> str:
        """The spec another process opens the same store with (``open_store(spec)``)."""
        return str(self.config)


BACKENDS = [pytest.param("sqlite", id="sqlite"),
            pytest.param("etcd", id="etcd", marks=pytest.mark.privileged)]


@pytest.fixture(params=BACKENDS)
def store_factory(request: pytest.FixtureRequest, tmp_path) -> Iterator[StoreFactory]:
    if request.param == "etcd":
        config = request.getfixturevalue("etcd_config")
    else:
        config = StoreConfig("sqlite", path=str(tmp_path / "store.db"))
    factory = StoreFactory(request.param, config, [])
    try:
        yield factory
    finally:
        for store in factory.opened:
            store.close()


@pytest.fixture
def store(store_factory: StoreFactory) -> Store:
    return store_factory()

