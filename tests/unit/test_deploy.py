"""deploy/: the CRDs match lace's schemas, the plain manifests match the chart, and every object
of both (and of the chart rendered with other values) is valid against Kubernetes' own schemas;
the CNI installer's plugin is the same bytes on every build and runs on a bare ``python3``.

The chart is rendered by Helm's engine (``helm-python-sdk``, see tools/render_manifests.py) and
every object is checked with ``kubernetes-validate`` (the apiserver's OpenAPI schemas, strict: an
unknown field fails) for the oldest Kubernetes the chart supports. Only the tests that use those
two packages skip without them; the CRD generator's and the installer's need neither.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))

import gen_crds  # noqa: E402
import render_manifests  # noqa: E402

from lace.cni import install  # noqa: E402

KUBERNETES_VERSION = "1.33.0"   # Chart.yaml's kubeVersion floor (networking.k8s.io/v1 ServiceCIDR)
CRD_DIR = os.path.join(ROOT, "deploy", "helm", "lace", "crds")


@pytest.fixture
def validator() -> None:
    """Kubernetes' schemas for ``_validate`` (the test skips without ``kubernetes-validate``)."""
    pytest.importorskip("kubernetes_validate")


@pytest.fixture
def helm() -> None:
    """Helm's engine for rendering the chart (the test skips without ``helm-python-sdk``)."""
    pytest.importorskip("helm_python")


def _validate(doc: dict) -> None:
    import kubernetes_validate
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        pytest.fail(f'{doc["kind"]} "{doc["metadata"]["name"]}": {err.message} at {list(err.path)}')


def _crds() -> list[dict]:
    docs = []
    for path in sorted(glob.glob(os.path.join(CRD_DIR, "*.yaml"))):
        with open(path) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


def test_committed_crds_are_generated_from_lace_schemas() -> None:
    assert gen_crds.main(["--check", "--out", CRD_DIR]) == 0, "run python tools/gen_crds.py"
    names = {d["spec"]["names"]["kind"] for d in _crds()}
    assert names == {"Network", "Segment", "IPBlock", "IPLease", "ServiceAllocation", "LoadBalancerIPPool"}


def test_crd_check_notices_a_stale_file(tmp_path) -> None:
    gen_crds.main(["--out", str(tmp_path)])
    assert gen_crds.main(["--check", "--out", str(tmp_path)]) == 0
    path = tmp_path / "networks.lace.dev.yaml"
    path.write_text(path.read_text().replace("minItems: 1", "minItems: 2"))
    assert gen_crds.main(["--check", "--out", str(tmp_path)]) == 1


def test_crds_are_valid_with_printer_columns_and_status(validator) -> None:
    for doc in _crds():
        _validate(doc)
        version = doc["spec"]["versions"][0]
        assert [c["name"] for c in version["additionalPrinterColumns"]][-1] == "Age"
        assert ("subresources" in version) == (doc["spec"]["names"]["kind"] == "Network")


def _structural_errors(schema: dict, path: str = "") -> list[str]:
    """What Kubernetes' structural-schema rules refuse: a list type, additionalProperties false,
    properties beside additionalProperties, an object without a type."""
    errors = []
    if "x-kubernetes-int-or-string" not in schema and not isinstance(schema.get("type"), str):
        errors.append(f"{path}: no single type")
    if schema.get("additionalProperties") is False:
        errors.append(f"{path}: additionalProperties false")
    if "properties" in schema and "additionalProperties" in schema:
        errors.append(f"{path}: properties and additionalProperties")
    for name, sub in (schema.get("properties") or {}).items():
        errors += _structural_errors(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            errors += _structural_errors(schema[key], f"{path}[{key}]")
    return errors


def test_crd_schemas_are_structural_and_accept_lace_objects() -> None:
    import jsonschema
    from lace.store import rules

    by_kind = {d["spec"]["names"]["kind"]: d["spec"]["versions"][0]["schema"]["openAPIV3Schema"] for d in _crds()}
    for kind, schema in by_kind.items():
        assert _structural_errors(schema) == [], kind
    network = next(o for o in rules.builtin_objects() if o["kind"] == "Network")
    jsonschema.validate(network, by_kind["Network"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**network, "spec": {"cidrs": []}}, by_kind["Network"])


def test_plain_manifests_are_the_chart_rendered(helm) -> None:
    assert render_manifests.main(["--check"]) == 0, "run python tools/render_manifests.py"


def test_plain_manifests_are_valid(validator) -> None:
    with open(render_manifests.OUT) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("DaemonSet") == 1 and kinds.count("Deployment") == 1 and "ConfigMap" in kinds
    for doc in docs:
        _validate(doc)


@pytest.mark.parametrize("values", [
    {},
    {"config": {"metricsPort": 0, "kubeletCgroup": "/sys/fs/cgroup/kubelet.slice"},
     "node": {"updateStrategy": {"maxUnavailable": "10%"}}, "operator": {"replicas": 1},
     "image": {"repository": "registry.example/lace", "tag": "0.2.0"},
     "apiServer": {"host": "fd00::10", "port": 8443}},
], ids=["defaults", "custom"])
def test_chart_renders_valid_objects(values: dict, validator, helm) -> None:
    docs = render_chart = render_manifests.render_chart(values, namespace="cni")
    for doc in docs:
        _validate(doc)
    ds = next(d for d in render_chart if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    agent = spec["containers"][0]
    assert spec["hostNetwork"] and agent["securityContext"]["privileged"]
    mounts = {m["mountPath"] for m in agent["volumeMounts"]}
    assert {"/sys/fs/bpf", "/sys/fs/cgroup", "/var/run/netns", "/var/run/lace"} <= mounts
    assert spec["initContainers"][0]["command"][:3] == ["python3", "-m", "lace.cni.install"]
    assert agent["readinessProbe"]["exec"]["command"][:2] == ["node", "status"]
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
    cm = next(d for d in render_chart if d["kind"] == "ConfigMap")
    assert cm["data"]["store"] == "k8s://?namespace=cni"
    if values:
        assert "--kubelet-cgroup=$(LACE_KUBELET_CGROUP)" in agent["args"]
        assert not any(a.startswith("--metrics-port") for a in agent["args"])
        assert agent["image"] == "registry.example/lace:0.2.0"
    # the apiserver straight (apiServer.host), not through the ClusterIP lace programs, in both workloads
    operator = next(d for d in render_chart if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    for container in (agent, operator):
        env = {e["name"]: e.get("value") for e in container["env"]}
        if values:
            assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("fd00::10", "8443")
        else:
            assert "KUBERNETES_SERVICE_HOST" not in env and "KUBERNETES_SERVICE_PORT" not in env


def test_rbac_is_least_privilege(helm) -> None:
    docs = render_manifests.render_chart()
    roles = {(d["kind"], d["metadata"]["name"]): d["rules"] for d in docs if d["kind"] in ("ClusterRole", "Role")}
    for (kind, name), rules in roles.items():
        for rule in rules:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], (kind, name, rule)
            # nothing of lace writes Pods or EndpointSlices: Kubernetes owns them; only the
            # operator updates Services (their lace.dev/service-id annotation), and it creates none
            if set(rule["resources"]) & {"pods", "endpointslices", "networkpolicies"}:
                assert set(rule["verbs"]) <= {"get", "list", "watch"}, (kind, name, rule)
            if "services" in rule["resources"]:
                allowed = {"get", "list", "watch"} | ({"update"} if name == "lace-operator" else set())
                assert set(rule["verbs"]) <= allowed, (kind, name, rule)
    node_writes = {r for rule in roles[("ClusterRole", "lace-node")] if "create" in rule["verbs"]
                   for r in rule["resources"]}
    assert node_writes == {"segments", "ipblocks", "ipleases"}


def test_lace_exec_finds_the_pod_the_chart_makes(helm) -> None:
    """`lace exec --node N --context C` looks for the lace-node pod where deploy/ puts it, and the
    node command inside finds its pins, node, store and agent socket in the container's env."""
    from lace.cli.commands import exec as lexec

    docs = render_manifests.render_chart(namespace=lexec.NODE_POD_NAMESPACE)
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    key, _, value = lexec.NODE_POD_SELECTOR.partition("=")
    assert ds["metadata"]["namespace"] == lexec.NODE_POD_NAMESPACE == render_manifests.NAMESPACE
    assert ds["spec"]["template"]["metadata"]["labels"][key] == value
    agent = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == lexec.NODE_CONTAINER)
    env = {e["name"] for e in agent["env"]}
    assert {"LACE_PIN_ROOT", "LACE_STORE", "LACE_NODE", "LACE_AGENT_SOCKET"} <= env


def test_cni_plugin_is_the_same_bytes_every_build_and_runs_without_site_packages(tmp_path) -> None:
    """The installer rewrites the plugin only when it changed: two builds are the same bytes, a
    second install changes nothing; and the zipapp runs on a bare ``python3 -S`` (no site-packages,
    nothing of lace's dependencies), answering CNI's VERSION."""
    first = install.plugin_zipapp()
    assert install.plugin_zipapp() == first
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    assert len(install.install(str(bin_dir), str(conf_dir), "/var/run/lace/agent.sock")) == 2
    assert install.install(str(bin_dir), str(conf_dir), "/var/run/lace/agent.sock") == []
    plugin = bin_dir / install.PLUGIN
    assert plugin.read_bytes() == first and os.access(plugin, os.X_OK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    r = subprocess.run([sys.executable, "-S", str(plugin)], env={**env, "CNI_COMMAND": "VERSION"},
                       cwd=tmp_path, input="", capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    assert answer["cniVersion"] == install.CNI_VERSION and install.CNI_VERSION in answer["supportedVersions"]
