"""deploy/: the CRDs match lace's schemas, the plain manifests match the chart, and every object
of both (and of the chart rendered with other values) is valid against Kubernetes' own schemas.

The chart is rendered by Helm's engine (``helm-python-sdk``, see tools/render_manifests.py) and
every object is checked with ``kubernetes-validate`` (the apiserver's OpenAPI schemas, strict: an
unknown field fails) for the oldest Kubernetes the chart supports.
"""

from __future__ import annotations

import glob
import os
import sys

import pytest
import yaml

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))

import gen_crds  # noqa: E402
import render_manifests  # noqa: E402

kubernetes_validate = pytest.importorskip("kubernetes_validate")
pytest.importorskip("helm_python")

KUBERNETES_VERSION = "1.33.0"   # Chart.yaml's kubeVersion floor (networking.k8s.io/v1 ServiceCIDR)
CRD_DIR = os.path.join(ROOT, "deploy", "helm", "lace", "crds")


def _validate(doc: dict) -> None:
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


def test_crds_are_valid_with_printer_columns_and_status() -> None:
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


def test_plain_manifests_are_the_chart_rendered() -> None:
    assert render_manifests.main(["--check"]) == 0, "run python tools/render_manifests.py"


def test_plain_manifests_are_valid() -> None:
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
     "image": {"repository": "registry.example/lace", "tag": "0.2.0"}},
], ids=["defaults", "custom"])
def test_chart_renders_valid_objects(values: dict) -> None:
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


def test_rbac_is_least_privilege() -> None:
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


def test_lace_exec_finds_the_pod_the_chart_makes() -> None:
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
