"""The object commands (apply/get/delete) run in-process through main(argv, env)."""

from __future__ import annotations

import io
import json

import pytest
import yaml

from lace.cli import context
from lace.cli.main import main
from lace.cli.status import ExitStatus
from lace.store import SqliteStore

MANIFEST = """\
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: lace.dev/v1alpha1
kind: Network
metadata: {name: blue}
spec:
  cidrs: [10.10.0.0/16, "fd00:b::/56"]
  routes:
  - {to: outside, masquerade: true}
  - {to: default, cidrs: [10.244.0.0/16]}
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: demo
  labels: {app: web}
  annotations: {lace.dev/network: blue}
spec: {nodeName: node-1}
"""


class Run:
    """Calls main in-process with a temp state dir and captures its streams."""

    def __init__(self, env):
        self.env = env

    def __call__(self, *argv, stdin=""):
        out, err = io.StringIO(), io.StringIO()
        status = main(list(argv), self.env, stdin=io.StringIO(stdin), stdout=out, stderr=err)
        self.out, self.err = out.getvalue(), err.getvalue()
        return status


@pytest.fixture
def env(tmp_path):
    env = {"LACE_STATE_DIR": str(tmp_path / "state")}
    lab = context.lab_context("t", env)
    lab.dir.mkdir(parents=True)
    SqliteStore(lab.store_path).close()
    context.set_current("t", env)
    return env


@pytest.fixture
def run(env):
    return Run(env)


@pytest.fixture
def manifest(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text(MANIFEST)
    return str(p)


def store_of(env):
    return SqliteStore(context.lab_context("t", env).store_path)


def test_apply_prints_created_then_unchanged_then_configured(run, manifest, tmp_path):
    assert run("apply", "-f", manifest) == ExitStatus.OK
    assert run.out.splitlines() == ["namespace/demo created", "network.lace.dev/blue created", "pod/web created"]
    assert run("apply", "-f", manifest) == ExitStatus.OK
    assert run.out.splitlines() == ["namespace/demo unchanged", "network.lace.dev/blue unchanged",
                                    "pod/web unchanged"]
    changed = tmp_path / "c.yaml"
    changed.write_text(MANIFEST.replace("app: web", "app: web2"))
    assert run("apply", "-f", str(changed)) == ExitStatus.OK
    assert "pod/web configured" in run.out.splitlines()


def test_apply_from_stdin_json_and_list(run):
    doc = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}}]}
    assert run("apply", "-f", "-", stdin=json.dumps(doc)) == ExitStatus.OK
    assert run.out.splitlines() == ["namespace/a created", "namespace/b created"]


def test_bad_document_is_one_named_line_and_nothing_is_written(run, env, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(MANIFEST + "---\n" + """\
apiVersion: lace.dev/v1alpha1
kind: Network
metadata: {name: red}
spec: {cidrs: [10.20.0.0/16, 10.244.9.0/24]}
""")
    with store_of(env) as s:
        rev = s.revision()
    assert run("apply", "-f", str(bad)) == ExitStatus.INVALID
    assert run.out == ""
    lines = run.err.splitlines()
    assert lines[0].startswith(f"error: {bad} (document 4): Network \"red\" is invalid: spec.cidrs[1]: ")
    assert "overlaps the default network" in lines[0]
    assert "Traceback" not in run.err and len(lines) == 1
    with store_of(env) as s:
        assert s.revision() == rev
        assert [n["metadata"]["name"] for n in s.list("networks").items] == ["default"]


@pytest.mark.parametrize("text, words", [
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: nope}\n", "create Namespace nope first"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: {lace.dev/network: x}}\n",
     'Network "x" does not exist'),
    ("apiVersion: v1\nkind: Gadget\nmetadata: {name: p}\n", 'unknown kind "Gadget"'),
    ("kind: Pod\napiVersion: v2\nmetadata: {name: p}\n", "set apiVersion: v1"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {}\n", "metadata.name"),
    ("key: [unclosed\n", "cannot parse YAML"),
    ("- a\n- b\n", "expected an object"),
])
def test_bad_input_errors(run, tmp_path, text, words):
    p = tmp_path / "x.yaml"
    p.write_text(text)
    status = run("apply", "-f", str(p))
    assert status in (ExitStatus.INVALID, ExitStatus.NOT_FOUND)
    assert run.err.startswith("error: ") and words in run.err.splitlines()[0], run.err
    assert "Traceback" not in run.err


def test_apply_missing_file(run, tmp_path):
    assert run("apply", "-f", str(tmp_path / "none.yaml")) == ExitStatus.NOT_FOUND
    assert "no such file" in run.err


def test_get_pods_table_and_all_namespaces(run, manifest, env):
    run("apply", "-f", manifest)
    with store_of(env) as s:
        s.update_status("pod", "web", "demo", {
            "phase": "Running", "podIPs": [{"ip": "10.10.0.5"}, {"ip": "fd00:b::5"}],
            "containerStatuses": [{"name": "c", "ready": False, "restartCount": 2}]})
    assert run("get", "pods") == ExitStatus.OK
    assert run.out == "" and run.err == "No resources found in default namespace.\n"
    assert run("get", "po", "-n", "demo") == ExitStatus.OK
    header, row = run.out.splitlines()
    assert header.split() == ["NAME", "NODE", "NETWORK", "IPS", "READY", "PHASE", "RESTARTS", "AGE"]
    assert row.split()[:7] == ["web", "node-1", "blue", "10.10.0.5,fd00:b::5", "0/1", "Running", "2"]
    assert run("get", "pods", "-A", "-o", "wide") == ExitStatus.OK
    header, row = run.out.splitlines()
    assert header.split()[:2] == ["NAMESPACE", "NAME"] and header.split()[-1] == "LABELS"
    assert row.split()[0] == "demo" and row.split()[-1] == "app=web"


def test_get_pods_json_is_a_list_with_node_network_ips_phase(run, manifest, env):
    run("apply", "-f", manifest)
    with store_of(env) as s:
        s.update_status("pod", "web", "demo", {"phase": "Running", "podIPs": [{"ip": "10.10.0.5"}]})
    assert run("get", "pods", "-A", "-o", "json") == ExitStatus.OK
    doc = json.loads(run.out)
    assert doc["kind"] == "List" and doc["apiVersion"] == "v1"
    (p,) = doc["items"]
    assert p["spec"]["nodeName"] == "node-1"
    assert p["metadata"]["annotations"]["lace.dev/network"] == "blue"
    assert p["status"] == {"phase": "Running", "podIPs": [{"ip": "10.10.0.5"}]}
    assert run("get", "pod", "web", "-n", "demo", "-o", "json") == ExitStatus.OK
    assert json.loads(run.out)["kind"] == "Pod"
    assert run("get", "pods", "-o", "json") == ExitStatus.OK
    assert json.loads(run.out)["items"] == [] and run.err == ""
    assert run("get", "pod/web", "-n", "demo", "-o", "yaml") == ExitStatus.OK
    assert yaml.safe_load(run.out)["metadata"]["name"] == "web"


def test_get_networks(run, manifest):
    run("apply", "-f", manifest)
    assert run("get", "networks") == ExitStatus.OK
    lines = run.out.splitlines()
    assert lines[0].split() == ["NAME", "ID", "CIDRS", "ROUTES", "AGE"]
    blue = lines[1].split()
    assert blue[:4] == ["blue", "2", "10.10.0.0/16,fd00:b::/56", "outside(masq),default[10.244.0.0/16]"]
    assert lines[2].split()[:3] == ["default", "1", "10.244.0.0/16,fd00:10:244::/56"]
    assert run("get", "net", "-o", "name") == ExitStatus.OK
    assert run.out.splitlines() == ["network.lace.dev/blue", "network.lace.dev/default"]


def test_get_selector_and_other_kinds(run, manifest, env):
    run("apply", "-f", manifest)
    assert run("get", "pods", "-A", "-l", "app=web", "-o", "name") == ExitStatus.OK
    assert run.out == "pod/web\n"
    assert run("get", "pods", "-A", "-l", "app notin (web)") == ExitStatus.OK
    assert run.err == "No resources found.\n"
    assert run("get", "pods", "-A", "-l", "app in (") == ExitStatus.INVALID
    assert run.err.startswith("error: ")
    with store_of(env) as s:
        s.allocate_segment("blue", "demo", {"app": "web"})
        s.allocate_block("blue", "node-1", 4, 24)
    for kind in ("ns", "nodes", "netpol", "svc", "segments", "ipblocks", "ipleases"):
        assert run("get", kind, "-A") == ExitStatus.OK, run.err
    assert run("get", "segments") == ExitStatus.OK and "256" in run.out
    assert run("get", "ipblocks") == ExitStatus.OK and "10.10.0.0/24" in run.out


def test_get_errors(run, manifest):
    assert run("get", "widgets") == ExitStatus.NOT_FOUND
    assert run.err.splitlines()[0] == 'error: the store has no resource type "widgets"'
    assert run("get", "pod", "nope") == ExitStatus.NOT_FOUND
    assert 'Pod "nope" not found in namespace "default"' in run.err
    assert run("get") == ExitStatus.USAGE and "networks" in run.err
    assert run("get", "pods", "-A", "-n", "x") == ExitStatus.USAGE
    assert run("get", "pods", "-o", "xml") == ExitStatus.USAGE
    assert run.err.startswith("error: lace get: argument -o/--output: invalid choice")


def test_delete_by_name_and_file(run, manifest):
    run("apply", "-f", manifest)
    assert run("delete", "network", "blue") == ExitStatus.FORBIDDEN
    assert run.err.splitlines()[0] == 'error: Network "blue" is in use by 1 pod(s): demo/web'
    assert run("delete", "pod", "web", "-n", "demo") == ExitStatus.OK
    assert run.out == 'pod "web" deleted\n'
    assert run("delete", "pod", "web", "-n", "demo") == ExitStatus.NOT_FOUND
    assert run("delete", "pod", "web", "-n", "demo", "--ignore-not-found") == ExitStatus.OK
    run("apply", "-f", manifest)
    assert run("delete", "-f", manifest) == ExitStatus.OK
    assert run.out.splitlines() == ['pod "web" deleted', 'network.lace.dev "blue" deleted',
                                    'namespace "demo" deleted']
    assert run("delete", "net", "default") == ExitStatus.FORBIDDEN
    assert "cannot be deleted" in run.err


def test_delete_usage(run):
    assert run("delete") == ExitStatus.USAGE
    assert run("delete", "pods") == ExitStatus.USAGE
    assert run("delete", "pods", "--all") == ExitStatus.OK
    assert run.err == "No resources found in default namespace.\n"


def test_lab_selection(tmp_path):
    env = {"LACE_STATE_DIR": str(tmp_path / "empty")}
    run = Run(env)
    assert run("get", "pods") == ExitStatus.UNAVAILABLE
    assert run.err.splitlines()[0] == "error: no lab is running: run `lace lab up`"
    assert "Traceback" not in run.err
    other = context.lab_context("other", env)
    other.dir.mkdir(parents=True)
    assert run("get", "ns", "--lab", "other", "-o", "name") == ExitStatus.OK
    assert "namespace/default" in run.out
    assert Run({**env, "LACE_LAB": "other"})("get", "ns") == ExitStatus.OK
    assert run("--lab", "missing", "get", "ns") == ExitStatus.NOT_FOUND
    assert 'lab "missing"' in run.err and "existing labs: other" in run.err
    context.set_current("other", env)
    assert context.resolve_lab(type("A", (), {"lab": None})(), env).name == "other"


def test_help_and_usage(run):
    assert run("--help") == ExitStatus.OK and "apply" in run.out and "get" in run.out
    assert run() == ExitStatus.USAGE
    assert run("frobnicate") == ExitStatus.USAGE and run.err.startswith("error: ")


def test_unexpected_exception_is_one_line(run, monkeypatch):
    from lace.cli.commands import get as get_cmd

    def boom(args, inv):
        raise RuntimeError("kaput")

    monkeypatch.setattr(get_cmd, "run", boom)
    import lace.cli.args as a
    orig = a.define_get
    monkeypatch.setattr(get_cmd, "register", lambda sp: orig(sp).set_defaults(handler=boom))
    assert run("get", "pods") == ExitStatus.ERROR
    assert run.err.splitlines()[0] == "error: unexpected RuntimeError: kaput"
    assert "LACE_DEBUG=1" in run.err and "Traceback" not in run.err
    debug = Run({**run.env, "LACE_DEBUG": "1"})
    assert debug("get", "pods") == ExitStatus.ERROR and "Traceback" in debug.err


def test_lab_up_refuses_bad_input_with_a_clear_error(tmp_path):
    """No lab is built: the node count and the name are checked first, one error line each."""
    import io
    from lace.cli.main import main
    env = {"LACE_STATE_DIR": str(tmp_path)}
    for argv, words in ((["lab", "up", "--nodes", "99"], "1 to 16"),
                        (["lab", "up", "--name", "waytoolongname"], "invalid lab name")):
        out, err = io.StringIO(), io.StringIO()
        rc = main(argv, env, stdout=out, stderr=err)
        assert int(rc) == 2 and words in err.getvalue() and "Traceback" not in err.getvalue()
        assert "bug" not in err.getvalue()
