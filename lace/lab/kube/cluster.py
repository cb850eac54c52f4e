"""``lace lab up --kubernetes``: the lab's topology with the real control plane and real nodes,
lace installed by its Helm chart as a user installs it.

Bring-up, in order: the binaries checked (``make upstream``), the topology (``lace.lab.topology``),
the control plane (``controlplane``), every node's holder, containerd and kubelet (``node``), the
images imported into every node (``images``), the nodes' lace annotations (below), the chart
installed with the real Helm (``HELM_VALUES``), then waited for: the ``lace-node`` DaemonSet
ready on every node, every node Ready (a node is Ready only once lace's CNI configuration is on
it), and CoreDNS behind ``kube-system/kube-dns``.

The nodes' annotations: the lab's fabric routes node i's locator (fd5e:c000:i::/48) to node i's
underlay address, so the lab gives each node its ID, locator and underlay address as the operator
of a network whose underlay routes are planned does (lace's operator hands out only what a node
lacks). The lab's store is then the apiserver (``k8s://?kubeconfig=<admin.conf>&netns=<control>``):
every ``lace`` command of the lab talks to it."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

from lace.lab import procs, topology
from lace.lab.dns import CLUSTER_IPS
from lace.store import kinds as K
from lace.store.config import StoreConfig, write_lab_store

from . import addons, controlplane, images, node
from .upstream import REPO_ROOT, binary, require

Progress = Callable[[str], None]

CHART = REPO_ROOT / "deploy" / "helm" / "lace"
RELEASE = "lace"
NAMESPACE = "lace-system"
CLUSTER_FILE = os.path.join("kubernetes", "cluster.json")
#: how long `lab up` waits for lace to be running and every node Ready
READY_TIMEOUT = 240.0


class KubeLabError(topology.LabError):
    """The real-cluster lab did not come up; the message says which part and where its log is."""


def helm_values(lab: Any) -> dict[str, Any]:
    """The chart's values for this lab, as the docs show them: the image imported into the nodes
    (never pulled), the apiserver reached directly (no kube-proxy, and lace has yet to program the
    ``kubernetes`` Service when it starts), the node's host cgroup for the socket hooks and its
    kubelet's cgroup as the one allowed to probe isolated pods."""
    return {
        "image": {"pullPolicy": "Never"},
        "apiServer": {"host": controlplane.CONTROL4, "port": controlplane.API_PORT},
        "node": {"cgroupRoot": node.HOST_CGROUP},
        "config": {"kubeletCgroup": topology.kubelet_cgroup(node.HOST_CGROUP)},
    }


def _kubectl(cp: controlplane.ControlPlane, *args: str, timeout: float = 60.0, stdin: str | None = None) -> str:
    r = controlplane.kubectl(cp, *args, timeout=timeout, stdin=stdin)
    if r.returncode != 0:
        raise KubeLabError(f"kubectl {' '.join(args)}: {r.output.strip()[-1500:]}")
    return r.output


def annotate_nodes(cp: controlplane.ControlPlane, lab: Any, timeout: float = 60.0) -> None:
    """Wait for every kubelet to register its Node, then give it its lace annotations."""
    deadline = time.monotonic() + timeout
    want = {n.name for n in lab.nodes}
    while True:
        doc = json.loads(_kubectl(cp, "get", "nodes", "-o", "json"))
        have = {n["metadata"]["name"] for n in doc["items"]}
        if want <= have:
            break
        if time.monotonic() > deadline:
            raise KubeLabError(f"nodes not registered within {timeout:.0f}s: {', '.join(sorted(want - have))} "
                               f"(their kubelet logs: {os.path.join(lab.state_dir, 'logs')}/kubelet-<node>.log)")
        time.sleep(0.2)
    for n in lab.nodes:
        _kubectl(cp, "annotate", "node", n.name, "--overwrite", f"{K.NODE_ID_ANNOTATION}={n.node_id}",
                 f"{K.LOCATOR_ANNOTATION}={n.locator}", f"{K.UNDERLAY_ANNOTATION}={n.underlay_addr}")


def helm(cp: controlplane.ControlPlane, *args: str, timeout: float = 300.0) -> str:
    """The real Helm against the lab's apiserver, its caches in the lab's state."""
    home = os.path.join(cp.directory, "helm")
    env = {"HELM_CACHE_HOME": f"{home}/cache", "HELM_CONFIG_HOME": f"{home}/config",
           "HELM_DATA_HOME": f"{home}/data", "HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    r = procs.run([binary("helm"), f"--kubeconfig={cp.admin_kubeconfig}", *args], netns=cp.netns,
                  timeout=timeout, output_limit=1 << 20, env=env)
    if r.returncode != 0:
        raise KubeLabError(f"helm {' '.join(args[:2])}: {r.output.strip()[-1500:]}")
    return r.output


def install_lace(cp: controlplane.ControlPlane, lab: Any) -> None:
    values = os.path.join(cp.directory, "lace-values.json")
    with open(values, "w") as f:
        json.dump(helm_values(lab), f, indent=2)
    helm(cp, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace", "--values", values)


def wait_ready(cp: controlplane.ControlPlane, lab: Any, timeout: float = READY_TIMEOUT) -> None:
    """lace-node ready on every node, then every node Ready."""
    _kubectl(cp, "rollout", "status", "daemonset/lace-node", "-n", NAMESPACE, f"--timeout={int(timeout)}s",
             timeout=timeout + 10)
    _kubectl(cp, "wait", "node", "--all", "--for=condition=Ready", f"--timeout={int(timeout)}s", timeout=timeout + 10)


def route_default_network(cp: controlplane.ControlPlane, timeout: float = 60.0) -> None:
    """Give the default Network a masqueraded route to the outside, once lace has created it: the
    control plane and everything beyond the pod networks is outside (lace's default network has
    no way out until an operator gives it one)."""
    patch = json.dumps({"spec": {"routes": [{"to": K.ROUTE_OUTSIDE, "masquerade": True}]}})
    deadline = time.monotonic() + timeout
    while True:
        r = controlplane.kubectl(cp, "patch", "networks.lace.dev", K.DEFAULT_NETWORK, "--type=merge", "-p", patch)
        if r.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise KubeLabError(f"cannot route the default network to the outside: {r.output.strip()[-800:]}")
        time.sleep(0.2)


def start_dns(cp: controlplane.ControlPlane, archives: list[images.Archive], timeout: float = 120.0) -> None:
    image = next(a.image for a in archives if "/coredns/coredns:" in a.image)
    doc = {"apiVersion": "v1", "kind": "List", "items": addons.coredns(image)}
    _kubectl(cp, "apply", "-f", "-", stdin=json.dumps(doc))
    _kubectl(cp, "rollout", "status", "deployment/coredns", "-n", "kube-system", f"--timeout={int(timeout)}s",
             timeout=timeout + 10)


def is_kubernetes(state_dir: str) -> bool:
    return os.path.exists(os.path.join(state_dir, CLUSTER_FILE))


def up(name: str, nodes: int, state_dir: str, progress: Progress = lambda s: None) -> Any:
    require()
    if topology.load(name, state_dir=state_dir) is not None:
        raise KubeLabError(f'lab "{name}" already exists')
    os.makedirs(os.path.join(state_dir, "logs"), exist_ok=True)
    try:
        lab = topology.build(topology.LabSpec(name=name, nodes=nodes), state_dir=state_dir, progress=progress)
        progress("building lace's image (make image) and the cluster's (deploy/image/upstream.sh)")
        archives = images.archives()
        cp = controlplane.start(name, state_dir, progress)
        with open(os.path.join(state_dir, CLUSTER_FILE), "w") as f:
            json.dump({"server": cp.server, "kubeconfig": cp.admin_kubeconfig, "netns": cp.netns}, f)
        write_lab_store(state_dir, StoreConfig("k8s", kubeconfig=cp.admin_kubeconfig, netns=cp.netns))
        kube_nodes = [node.kube_node(lab, n, state_dir) for n in lab.nodes]
        for kn in kube_nodes:
            progress(f"starting containerd and the kubelet on {kn.name}")
            node.start(kn, cp)
        progress(f"importing {len(archives)} images into every node's containerd")
        images.import_all(kube_nodes, archives)
        annotate_nodes(cp, lab)
        progress(f"helm install {RELEASE} {CHART.relative_to(REPO_ROOT)} --namespace {NAMESPACE}")
        install_lace(cp, lab)
        progress("waiting for lace-node on every node, and every node Ready")
        wait_ready(cp, lab)
        progress("routing the default network to the outside, masqueraded")
        route_default_network(cp)
        progress(f"cluster DNS: CoreDNS behind kube-system/kube-dns ({', '.join(CLUSTER_IPS)})")
        start_dns(cp, archives)
    except BaseException:
        procs.stop_all(state_dir)
        topology.destroy(name, state_dir=None)   # the state dir (logs) stays for a look
        raise
    return lab
