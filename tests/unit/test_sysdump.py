"""``lace sysdump`` without a lab: redaction of secret-like values in objects and text, the node
commands collected, the store part (Secret kind left out, objects redacted), the index with its
errors, and the archive."""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
from types import SimpleNamespace

from lace.cli import sysdump
from lace.datapath import registry
from lace.store import kinds as K


def test_redact_secret_like_keys_env_values_and_annotations():
    pod = {"kind": "Pod", "metadata": {"name": "p", "annotations": {"example.com/api-token": "abc123",
                                                                   "lace.dev/network": "red"}},
           "spec": {"containers": [{"name": "c", "env": [{"name": "DB_PASSWORD", "value": "hunter2"},
                                                          {"name": "MODE", "value": "fast"},
                                                          {"name": "API_KEY", "valueFrom": {"x": 1}}]}]},
           "status": {"phase": "Running"}, "password": "pw", "credentials": {"user": "u", "pass": "p"},
           "key": {"addr": "10.0.0.1"}}
    out = sysdump.redact(pod)
    text = json.dumps(out)
    for secret in ("abc123", "hunter2", '"pw"', '"user"'):
        assert secret not in text, secret
    assert out["metadata"]["annotations"]["lace.dev/network"] == "red"
    assert out["spec"]["containers"][0]["env"][1]["value"] == "fast"
    assert out["spec"]["containers"][0]["env"][2]["valueFrom"] == {"x": 1}   # a reference, no secret
    assert out["key"] == {"addr": "10.0.0.1"}      # a map entry's key is no secret
    assert out["status"] == {"phase": "Running"}
    assert pod["password"] == "pw", "the input is not changed"


def test_redact_text_in_logs():
    text = ("level=info token=abc123 node=worker-1\n"
            '{"password": "hunter2", "name": "x"}\n'
            "Authorization: Bearer eyJhbGciOi\n"
            "segment app=auth-service ok\n")
    out = sysdump.redact_text(text)
    assert "abc123" not in out and "hunter2" not in out and "eyJhbGciOi" not in out
    assert "node=worker-1" in out and '"name": "x"' in out and "app=auth-service ok" in out
    assert out.count(sysdump.REDACTED) == 3


def test_node_commands_cover_every_showable_map_ct_flows_devices():
    cmds = sysdump.node_commands(registry.SHOWABLE)
    files = [f for f, _, _ in cmds]
    for m in registry.SHOWABLE:
        assert f"bpf-{m}.json" in files
    assert {"ct.json", "flows.json", "devices.json"} <= set(files)
    assert all(argv[-2:] == ["-o", "json"] for _, argv, _ in cmds)
    assert ["bpf", "show", "services", "--endpoints", "-o", "json"] in [argv for _, argv, _ in cmds]


class FakeStore:
    def __init__(self, objs: dict[str, list[dict]], broken: set[str] = frozenset()) -> None:
        self.objs, self.broken = objs, broken

    def list(self, kind: str):
        if kind in self.broken:
            raise RuntimeError(f"cannot list {kind}")
        return SimpleNamespace(items=self.objs.get(kind, []))


def test_collector_store_logs_lab_files_index_and_errors(monkeypatch):
    with tempfile.TemporaryDirectory() as state, tempfile.TemporaryDirectory() as work:
        os.makedirs(os.path.join(state, "logs"))
        with open(os.path.join(state, "logs", "agent-worker-1.log"), "w") as f:
            f.write("started with token=s3cr3t\n")
        with open(os.path.join(state, "lab.json"), "w") as f:
            json.dump({"name": "x", "nodes": []}, f)
        # no procs.json: recorded as an error, the rest collected
        secret_kind = K.KindInfo("Secret", "v1", "secrets", "secret", (), True)
        monkeypatch.setattr(K, "KINDS", K.KINDS + (secret_kind,))
        store = FakeStore({"Pod": [{"metadata": {"name": "p", "annotations": {"x/token": "t0k"}}}],
                           "Secret": [{"metadata": {"name": "s"}, "data": {"k": "c2VjcmV0"}}]},
                          broken={"Segment"})
        root = os.path.join(work, "dump")
        os.makedirs(root)
        c = sysdump.Collector(root, "x", state, store, None)
        index = c.collect()
        paths = {f["path"] for f in index["files"]}
        assert "store/pods.json" in paths and "store/secrets.json" not in paths
        assert "logs/agent-worker-1.log" in paths and "lab/lab.json" in paths
        everything = ""
        for dirpath, _, names in os.walk(root):
            for n in names:
                with open(os.path.join(dirpath, n)) as f:
                    everything += f.read()
        assert "s3cr3t" not in everything and "t0k" not in everything and "c2VjcmV0" not in everything
        errors = {e["what"]: e for e in index["errors"]}
        assert "lab/procs.json" in errors and "store segments" in errors and "nodes" in errors
        with open(os.path.join(root, "index.json")) as f:
            assert json.load(f)["files"] == index["files"]
        out = os.path.join(work, "x.tar.gz")
        sysdump.write_archive(root, out, "x")
        with tarfile.open(out) as tar:
            names = tar.getnames()
        assert "x/index.json" in names and "x/store/pods.json" in names
        assert oct(os.stat(out).st_mode & 0o777) == "0o600"
