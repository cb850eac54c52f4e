"""lace on a real Kubernetes: the chart's DaemonSet and operator on real nodes, pods that are real
containers of the real kubelet talking across nodes in both families, a ClusterIP and CoreDNS
through lace (no kube-proxy), NetworkPolicy, the node-state commands through the apiserver's exec
into each node's lace-node pod, and what the real apiserver enforces (RBAC, the CRDs' schemas)."""

from __future__ import annotations

import json

from .conftest import agnhost_pod, wait_for

NODES = ("worker-1", "worker-2", "worker-3")

#: in an agnhost pod (its image has python3): GET http://HOST:PORT/PATH, the body on stdout
GET = ("import sys, urllib.request; h, p, path = sys.argv[1:4]; "
       "h = f'[{h}]' if ':' in h else h; "
       "print(urllib.request.urlopen(f'http://{h}:{p}/{path}', timeout=3).read().decode())")


def get(cluster, ns: str, pod: str, host: str, port: int = 8080, path: str = "hostname") -> tuple[int, str]:
    return cluster.kexec(ns, pod, "python3", "-c", GET, host, str(port), path)


def pod_ips(pod: dict) -> list[str]:
    return [p["ip"] for p in pod["status"]["podIPs"]]


def test_every_node_is_ready_and_runs_lace(cluster):
    nodes = cluster.kjson("get", "nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == list(NODES)
    for n in nodes:
        cond = {c["type"]: c["status"] for c in n["status"]["conditions"]}
        assert cond["Ready"] == "True", n["status"]["conditions"]
        assert n["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")
        addrs = {a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP"}
        assert len(addrs) == 2, addrs   # its fabric addresses, IPv4 and IPv6
    pods = cluster.kjson("get", "pods", "-n", "lace-system", "-l", "app.kubernetes.io/name=lace-node")["items"]
    assert sorted(p["spec"]["nodeName"] for p in pods) == list(NODES)
    assert all(p["status"]["phase"] == "Running" for p in pods)
    lease = cluster.kjson("get", "lease", "lace-operator", "-n", "lace-system")
    assert lease["spec"]["holderIdentity"].startswith("lace-operator-")


def test_node_state_commands_reach_the_lace_node_pod(cluster):
    rc, out, err = cluster.lace("exec", "--node", "worker-2", "--", "node", "bpf", "show", "routing")
    assert "10.244.0.0/16" in out and "outside" in out, out + err
    rc, out, _ = cluster.lace("exec", "--node", "worker-3", "--", "node", "status", "-o", "json")
    doc = json.loads(out)
    assert doc["healthy"] and doc["node"] == "worker-3", doc
    # kube-dns, created at the end of the bring-up, programmed on the node (a new Service reaches
    # the maps within the agent's resync period on this cluster; see docs/kubernetes.md)
    def kube_dns() -> str | None:
        _, text, _ = cluster.lace("exec", "--node", "worker-1", "--", "node", "bpf", "show", "services")
        return text if "kube-system/kube-dns" in text and "10.96.0.10" in text else None
    wait_for(kube_dns, "kube-dns in worker-1's services map", timeout=30, interval=0.5)
    # a flag of the node command and its exit status come through the exec
    rc, out, err = cluster.lace("exec", "--node", "worker-1", "--", "node", "bpf", "show", "nosuchmap", check=False)
    assert rc != 0 and "nosuchmap" in out + err


def test_pods_on_different_nodes_reach_each_other_in_both_families(cluster, ns):
    cluster.kapply([agnhost_pod("web", ns, "worker-1"), agnhost_pod("client", ns, "worker-2", "pause")])
    pods = cluster.ready(ns, ["web"])
    wait_for(lambda: cluster.kjson("get", "pod", "client", "-n", ns)["status"]["phase"] == "Running",
             "client running", timeout=60)
    ips = pod_ips(pods["web"])
    assert len(ips) == 2, ips
    for ip in ips:
        rc, out = get(cluster, ns, "client", ip)
        assert rc == 0 and out.strip() == "web", (ip, out)


def test_a_clusterip_and_its_dns_name_through_lace(cluster, ns):
    cluster.kapply([agnhost_pod(f"be{i}", ns, n, labels={"app": "be"}) for i, n in enumerate(NODES)] +
                   [agnhost_pod("client", ns, "worker-3", "pause"),
                    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "be", "namespace": ns},
                     "spec": {"selector": {"app": "be"}, "ipFamilyPolicy": "PreferDualStack",
                              "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}])
    cluster.ready(ns, ["be0", "be1", "be2"])
    svc = cluster.kjson("get", "service", "be", "-n", ns)
    vips = svc["spec"]["clusterIPs"]
    assert len(vips) == 2, vips   # the real allocator gave one of each family
    for vip in vips:
        seen = set()

        def answers() -> bool:
            rc, out = get(cluster, ns, "client", vip, 80)
            if rc == 0:
                seen.add(out.strip())
            return len(seen) >= 2
        wait_for(answers, f"{vip}:80 answered by two backends", timeout=60, interval=0.2)
        assert seen <= {"be0", "be1", "be2"}, seen
    # the name, resolved by CoreDNS behind kube-dns
    rc, out = cluster.kexec(ns, "client", "getent", "hosts", f"be.{ns}.svc.cluster.local")
    assert rc == 0 and out.split()[0] in vips, out


#: in an agnhost pod: the apiserver's /version through the `kubernetes` Service, as in-cluster
#: clients reach it (KUBERNETES_SERVICE_HOST/PORT); its gitVersion on stdout
VERSION = ("import json, os, ssl, urllib.request; h, p = os.environ['KUBERNETES_SERVICE_HOST'], "
           "os.environ['KUBERNETES_SERVICE_PORT']; c = ssl.create_default_context("
           "cafile='/var/run/secrets/kubernetes.io/serviceaccount/ca.crt'); "
           "print(json.load(urllib.request.urlopen(f'https://{h}:{p}/version', context=c, timeout=5))['gitVersion'])")


def test_a_pod_reaches_the_apiserver_through_the_kubernetes_service(cluster, ns):
    """The `kubernetes` Service's endpoint is the apiserver, outside every pod network: lace
    translates the ClusterIP to it and masquerades the flow out of the node."""
    cluster.kapply([agnhost_pod("client", ns, "worker-2", "pause")])
    wait_for(lambda: cluster.kjson("get", "pod", "client", "-n", ns)["status"]["phase"] == "Running",
             "client running", timeout=60)
    rc, out = cluster.kexec(ns, "client", "python3", "-c", VERSION)
    assert rc == 0 and out.strip().startswith("v1."), out
    rc, out, _ = cluster.lace("exec", "--node", "worker-2", "--", "node", "bpf", "show", "services")
    assert "default/kubernetes" in out, out


def test_network_policy_denies_and_the_node_names_the_drop(cluster, ns):
    cluster.kapply([agnhost_pod("guarded", ns, "worker-1"), agnhost_pod("client", ns, "worker-2", "pause")])
    pods = cluster.ready(ns, ["guarded"])
    ip = pod_ips(pods["guarded"])[0]
    wait_for(lambda: get(cluster, ns, "client", ip)[0] == 0, "guarded answers before the policy", timeout=60)
    cluster.kapply([{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                     "metadata": {"name": "deny", "namespace": ns},
                     "spec": {"podSelector": {"matchLabels": {"app": "guarded"}}, "policyTypes": ["Ingress"]}}])
    wait_for(lambda: get(cluster, ns, "client", ip)[0] != 0, "the policy to hold", timeout=30, interval=0.5)
    rc, out, _ = cluster.lace("exec", "--node", "worker-1", "--", "node", "trace", "flow", "--verdict", "drop",
                              "--ip", ip, "-o", "json")
    flows = json.loads(out)["flows"]
    assert any(f["reason"] == "policy-ingress" for f in flows), flows


def test_the_apiserver_enforces_rbac_and_the_crds_schema(cluster, tmp_path):
    # the agents' service account may read pods but not delete namespaces
    rc, out = cluster.kubectl("auth", "can-i", "list", "pods", "--as=system:serviceaccount:lace-system:lace-node",
                              check=False)
    assert rc == 0 and out.strip() == "yes", out
    rc, out = cluster.kubectl("auth", "can-i", "delete", "namespaces",
                              "--as=system:serviceaccount:lace-system:lace-node", check=False)
    assert rc != 0 and out.strip().startswith("no"), out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"apiVersion": "lace.dev/v1alpha1", "kind": "Network", "metadata": {"name": "bad"},
                               "spec": {"cidrs": "not-a-list"}}))
    rc, out = cluster.kubectl("apply", "-f", str(bad), check=False)
    assert rc != 0 and "spec.cidrs" in out, out
