"""``lace get services`` / ``endpointslices`` (and the service ranges) print like kubectl; a
rejected Service is one named line and nothing written; the examples apply."""

from __future__ import annotations

import io
import json
import os
import re

import pytest
import yaml

from lace.cli import context
from lace.cli.main import main
from lace.cli.status import ExitStatus
from lace.lab.dns import cluster_objects
from lace.store import SqliteStore

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")

MANIFEST = """\
apiVersion: lace.dev/v1alpha1
kind: LoadBalancerIPPool
metadata: {name: lab}
spec: {cidrs: [198.18.100.0/24]}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  clusterIP: 10.96.0.20
  ports: [{name: http, port: 80, targetPort: 8080}, {name: dns, port: 53, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: np}
spec:
  type: NodePort
  ports: [{port: 80, nodePort: 30080}]
---
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  selector: {app: web}
  ports: [{port: 443, nodePort: 30443}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: np-1, labels: {kubernetes.io/service-name: np}}
addressType: IPv4
endpoints:
- {addresses: [10.244.1.5]}
- {addresses: [10.244.1.6]}
- {addresses: [10.244.1.7]}
- {addresses: [10.244.1.8]}
ports: [{port: 8080}, {name: b, port: 8081}]
"""


@pytest.fixture
def run(tmp_path):
    env = {"LACE_STATE_DIR": str(tmp_path / "state")}
    lab = context.lab_context("t", env)
    lab.dir.mkdir(parents=True)
    SqliteStore(lab.store_path).close()
    context.set_current("t", env)

    class Run:
        path = lab.store_path

        def __call__(self, *argv, stdin=""):
            out, err = io.StringIO(), io.StringIO()
            status = main(list(argv), env, stdin=io.StringIO(stdin), stdout=out, stderr=err)
            self.out, self.err = out.getvalue(), err.getvalue()
            return status
    return Run()


def rows(text):
    return [line.split() for line in text.splitlines()]


def test_get_services_like_kubectl(run):
    assert run("apply", "-f", "-", stdin=MANIFEST) == ExitStatus.OK, run.err
    assert run("get", "svc") == ExitStatus.OK
    table = rows(run.out)
    assert table[0] == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]
    by_name = {r[0]: r for r in table[1:]}
    assert by_name["web"][1:5] == ["ClusterIP", "10.96.0.20", "<none>", "80/TCP,53/UDP"]
    assert by_name["np"][1] == "NodePort" and by_name["np"][3:5] == ["<none>", "80:30080/TCP"]
    assert by_name["lb"][1:5] == ["LoadBalancer", by_name["lb"][2], "198.18.100.1", "443:30443/TCP"]
    assert run("get", "services", "web", "-o", "wide") == ExitStatus.OK
    header, row = rows(run.out)
    assert header == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE", "SELECTOR", "NETWORK", "LABELS"]
    assert row[6:] == ["app=web", "default", "<none>"]
    assert run("get", "svc", "web", "-o", "json") == ExitStatus.OK
    doc = json.loads(run.out)
    assert doc["kind"] == "Service" and doc["spec"]["clusterIPs"] == ["10.96.0.20"] and doc["status"]["id"] >= 1
    assert run("get", "svc", "-o", "yaml") == ExitStatus.OK
    assert {o["metadata"]["name"] for o in yaml.safe_load(run.out)["items"]} == {"web", "np", "lb"}
    assert run("get", "service/lb", "-o", "name") == ExitStatus.OK and run.out == "service/lb\n"


def test_get_endpointslices_and_ranges(run):
    assert run("apply", "-f", "-", stdin=MANIFEST) == ExitStatus.OK, run.err
    assert run("get", "endpointslices") == ExitStatus.OK
    header, row = rows(run.out)
    assert header == ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]
    assert row[:4] == ["np-1", "IPv4", "8080,8081", "10.244.1.5,10.244.1.6,10.244.1.7"]
    assert re.split(r"\s{3,}", run.out.splitlines()[1])[3] == "10.244.1.5,10.244.1.6,10.244.1.7 + 1 more..."
    assert run("get", "endpointslice.discovery.k8s.io", "np-1", "-o", "json") == ExitStatus.OK
    assert json.loads(run.out)["addressType"] == "IPv4"
    assert run("get", "servicecidrs") == ExitStatus.OK
    assert rows(run.out)[1][:2] == ["kubernetes", "10.96.0.0/16,fd00:10:96::/112"]
    assert run("get", "lbpool") == ExitStatus.OK and rows(run.out)[1][:2] == ["lab", "198.18.100.0/24"]
    assert run("get", "serviceallocations") == ExitStatus.OK
    held = {r[0]: r[1:5] for r in rows(run.out)[1:]}
    assert held["clusterip.default.10-96-0-20"] == ["clusterIP", "10.96.0.20", "default", "default/web"]
    assert held["nodeport.30080"] == ["nodePort", "30080", "<none>", "default/np"]


def test_rejected_service_is_one_named_line_and_nothing_is_written(run):
    assert run("apply", "-f", "-", stdin=MANIFEST) == ExitStatus.OK
    with SqliteStore(run.path) as s:
        rev = s.revision()
    clash = MANIFEST.replace("name: web}", "name: web2}").split("---\n")[1]
    assert run("apply", "-f", "-", stdin=clash) == ExitStatus.INVALID
    (line,) = run.err.splitlines()
    assert line == ('error: <stdin>: Service "default/web2" is invalid: spec.clusterIPs[0]: '
                    '10.96.0.20 is already taken by Service "default/web" in Network "default"; '
                    'pick another address, or leave clusterIP out to get one')
    full = 'apiVersion: v1\nkind: Service\nmetadata: {name: lb2}\nspec: {type: LoadBalancer, ports: [{port: 1}]}\n'
    tiny = MANIFEST.split("---\n")[0].replace("198.18.100.0/24", "198.18.100.1/32")
    assert run("apply", "-f", "-", stdin=tiny + "---\n" + full) == ExitStatus.ERROR
    assert run.err.splitlines()[0] == ('error: Service "default/lb2": every IPv4 address of the '
                                       'LoadBalancerIPPools (198.18.100.1/32) is taken')
    assert run.err.splitlines()[1].startswith("hint: add a range to a pool")
    with SqliteStore(run.path) as s:
        assert s.revision() == rev


def test_examples_apply(run, tmp_path):
    # what `lace lab up` writes: the cluster DNS service that red imports
    lab_objects = tmp_path / "lab.json"
    lab_objects.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster_objects()}))
    assert run("apply", "-f", str(lab_objects)) == ExitStatus.OK, run.err
    assert run("apply", "-f", os.path.join(EXAMPLES, "demo.yaml")) == ExitStatus.OK, run.err
    assert run("apply", "-f", os.path.join(EXAMPLES, "services.yaml")) == ExitStatus.OK, run.err
    assert "network.lace.dev/red configured" in run.out
    assert run("get", "svc", "-A", "-o", "json") == ExitStatus.OK
    svcs = {f'{o["metadata"]["namespace"]}/{o["metadata"]["name"]}': o for o in json.loads(run.out)["items"]}
    assert svcs["kube-system/kube-dns"]["spec"]["clusterIP"] == "10.96.0.10"
    assert len(svcs["alpha/web"]["spec"]["clusterIPs"]) == 2
    assert svcs["alpha/red"]["spec"]["clusterIP"] != "10.96.0.10"
    assert svcs["alpha/web-lb"]["status"]["loadBalancer"]["ingress"][0]["ip"].startswith("198.18.100.")
