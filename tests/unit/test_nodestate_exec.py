"""lace exec: the command must be `node`, target selection, and the Kubernetes path (pod selection,
exec request, exit status) against a fake API object."""

from __future__ import annotations

import argparse
import io
from types import SimpleNamespace as NS

import pytest

from lace.cli.commands import exec as lexec
from lace.cli.errors import NotFoundError, UsageError
from lace.cli.invocation import Invocation


def test_command_must_be_node() -> None:
    assert lexec.node_command(["--", "node", "bpf", "show", "routing"]) == ["node", "bpf", "show", "routing"]
    with pytest.raises(UsageError):
        lexec.node_command(["--", "bash"])
    with pytest.raises(UsageError):
        lexec.node_command(["--"])


def test_target() -> None:
    a = argparse.Namespace(context=None, lab=None)
    assert lexec.target(a, {"LACE_STATE_DIR": "/nonexistent"}) == "lab"
    assert lexec.target(argparse.Namespace(context="prod", lab=None), {}) == "kubernetes"
    assert lexec.target(a, {"LACE_TARGET": "kubernetes"}) == "kubernetes"
    assert lexec.target(argparse.Namespace(context="prod", lab="x"), {}) == "lab"


def pod(name: str, node: str, phase: str = "Running") -> NS:
    return NS(metadata=NS(name=name), spec=NS(node_name=node), status=NS(phase=phase))


class FakeCore:
    def __init__(self, pods: list[NS]) -> None:
        self.pods = pods
        self.calls: list[tuple] = []

    def list_namespaced_pod(self, namespace: str, label_selector: str, field_selector: str) -> NS:
        self.calls.append((namespace, label_selector, field_selector))
        node = field_selector.split("=", 1)[1]
        return NS(items=[p for p in self.pods if p.spec.node_name == node])

    def connect_get_namespaced_pod_exec(self, *a: object, **kw: object) -> None:  # pragma: no cover
        raise AssertionError("called through stream()")


class FakeResp:
    def __init__(self, out: str, err: str, status: str) -> None:
        self.out, self.err, self.status, self.open = out, err, status, True

    def is_open(self) -> bool:
        return self.open

    def update(self, timeout: int) -> None:
        pass

    def peek_stdout(self) -> bool:
        return bool(self.out)

    def read_stdout(self) -> str:
        s, self.out = self.out, ""
        return s

    def peek_stderr(self) -> bool:
        return bool(self.err)

    def read_stderr(self) -> str:
        s, self.err, self.open = self.err, "", False
        return s

    def read_channel(self, ch: int) -> str:
        return self.status

    def close(self) -> None:
        pass


def test_pod_selection() -> None:
    core = FakeCore([pod("lace-node-a", "w1"), pod("lace-node-b", "w2"), pod("lace-node-c", "w2", "Pending")])
    assert lexec.find_node_pod(core, "w2") == "lace-node-b"
    assert core.calls[-1] == ("lace-system", "app.kubernetes.io/name=lace-node", "spec.nodeName=w2")
    with pytest.raises(NotFoundError):
        lexec.find_node_pod(core, "w9")


def test_exec_kubernetes_passes_output_and_status() -> None:
    core = FakeCore([pod("lace-node-a", "w1")])
    seen: dict = {}

    def stream(fn: object, **kw: object) -> FakeResp:
        seen.update(kw)
        return FakeResp("routing table\n", "warn\n", '{"status":"Failure","details":{"causes":'
                                                     '[{"reason":"ExitCode","message":"3"}]}}')
    out, err = io.StringIO(), io.StringIO()
    inv = Invocation({}, io.StringIO(), out, err)
    rc = lexec.exec_kubernetes("w1", ["node", "-n", "bpf", "show", "routing"], inv, core=core, stream_fn=stream)
    assert rc == 3
    assert out.getvalue() == "routing table\n" and err.getvalue() == "warn\n"
    assert seen["name"] == "lace-node-a" and seen["namespace"] == "lace-system"
    assert seen["command"] == ["node", "-n", "bpf", "show", "routing"] and seen["tty"] is False
    assert lexec.exit_code({"status": "Success"}) == 0
