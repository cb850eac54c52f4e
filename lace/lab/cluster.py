"""A lab cluster's lifecycle: bring up (topology, store, node registration and the cluster DNS
objects, one agent per node, the kubelet, the controllers, the DNS feeder), report status, run
commands in pods, restart agents, and tear everything down.

The store is the embedded SQLite file ``<state>/store.db``, or with ``store="etcd"`` a 3-member
etcd cluster on the first three nodes (``lace.lab.etcd``); every process finds it the same way
(``lace.store.config.lab_store``) and opens it with ``open_store``."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Callable

from lace import netlink
from lace.cni.client import AgentUnavailable, call
from lace.agent.model import ANN_LOCATOR, ANN_NODE_ID, ANN_UNDERLAY
from lace.store import Store, StoreError
from lace.store import kinds as K
from lace.store.config import lab_store, open_store

from . import controllers, dns, dnsfeed, procs, topology
from . import etcd as lab_etcd
from .kubelet import Sandboxes

Progress = Callable[[str], None]


#: a lab operation failed; the message names the lab or node and what to do (one type for the
#: topology and the cluster, so callers catch one)
LabError = topology.LabError


#: each agent serves Prometheus metrics on its node's addresses at this port (inside the node's namespace)
METRICS_PORT = 9962


def agent_socket(state_dir: str, node: str) -> str:
    """Where the machine reaches node's agent: the lab's own agents' sockets, or on a lab on
    Kubernetes the lace-node pod's (its hostPath /run/lace is the node's own directory)."""
    from .kube import cluster as kube_cluster, node as kube_node
    if kube_cluster.is_kubernetes(state_dir):
        return kube_node.agent_socket(state_dir, node)
    return os.path.join(state_dir, "agents", f"{node}.sock")


def _agent_argv(state_dir: str, node: Any) -> list[str]:
    return [sys.executable, "-m", "lace.agent", "--node", node.name,
            # inside its node's namespace, the agent reaches a lab's etcd over the fabric itself
            "--store", str(lab_store(state_dir).without_netns()), "--pin-root", node.pin_root,
            "--socket", agent_socket(state_dir, node.name), "--uplink", node.uplink,
            "--mtu", str(topology.POD_MTU), "--metrics-port", str(METRICS_PORT)] + \
        (["--cgroup", node.cgroup, "--kubelet-cgroup", topology.kubelet_cgroup(node.cgroup)] if node.cgroup else [])


def start_agent(state_dir: str, node: Any) -> int:
    return procs.spawn(_agent_argv(state_dir, node), netns=node.netns, name=f"agent-{node.name}",
                       state_dir=state_dir, log_path=os.path.join(state_dir, "logs", f"agent-{node.name}.log"))


def wait_agent(state_dir: str, node: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            status, body = call(agent_socket(state_dir, node), "GET", "/healthz", timeout=2)
            if status == 200:
                return body
            last = str(body)
        except AgentUnavailable as e:
            last = str(e)
        time.sleep(0.02)
    log = procs.log_file(state_dir, f"agent-{node}")
    raise LabError(f"agent on {node} did not become healthy in {timeout:.0f}s ({last}); log {log}:\n"
                   f"{procs.log_tail(log, 800)}")


def register_nodes(store: Store, lab: Any, only: set[str] | None = None) -> None:
    """Write the lab's Node objects (all, or those named in ``only``: a removed node registering
    again) with their locator, underlay and node ID, and their addresses as a kubelet reports them."""
    nodes = [n for n in lab.nodes if only is None or n.name in only]
    objs = []
    for n in nodes:
        objs.append({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": n.name, "labels": {"kubernetes.io/hostname": n.name, K.LAB_LABEL: lab.name},
            "annotations": {ANN_LOCATOR: n.locator, ANN_UNDERLAY: n.underlay_addr, ANN_NODE_ID: str(n.node_id)}}})
    store.apply_all(objs)
    for n in nodes:
        # as a kubelet reports them: the addresses NodePorts answer on and IPv4 masquerades to
        store.update_status("nodes", n.name, None, {"addresses": [
            {"type": "InternalIP", "address": a} for a in (n.underlay_addr4, n.underlay_addr) if a]})


STORES = ("sqlite", "etcd")


def up(name: str, nodes: int, state_dir: str, progress: Progress = lambda s: None, *,
       store: str = "sqlite") -> Any:
    if store not in STORES:
        raise LabError(f'unknown store "{store}" (one of: {", ".join(STORES)})')
    if topology.load(name, state_dir=state_dir) is not None or netlink.netns.list_netns(f"lace-{name}-"):
        raise LabError(f'lab "{name}" already exists', ) from None
    os.makedirs(os.path.join(state_dir, "logs"), exist_ok=True)
    try:
        lab = topology.build(topology.LabSpec(name=name, nodes=nodes), state_dir=state_dir, progress=progress)
        if store == "etcd":
            members = lab.nodes[:lab_etcd.LAB_MEMBERS]
            progress(f"starting etcd on {', '.join(n.name for n in members)}")
            try:
                lab_etcd.start_lab_cluster(lab, state_dir)
            except StoreError as err:
                raise LabError(f"etcd did not come up: {err}") from None
        progress("opening the store")
        try:
            opened = open_store(lab_store(state_dir))
        except StoreError as err:
            raise LabError(f"cannot open the lab's store: {err}") from None
        try:
            register_nodes(opened, lab)
            # kube-system/kube-dns and its pod, as a cluster's addons (lace.lab.dns)
            opened.apply_all(dns.cluster_objects())
        finally:
            opened.close()
        for n in lab.nodes:
            progress(f"starting the agent on {n.name}")
            start_agent(state_dir, n)
        for n in lab.nodes:
            wait_agent(state_dir, n.name)
            progress(f"agent on {n.name} is ready")
        progress("starting the kubelet")
        start_kubelet(name, state_dir)
        progress("starting the controllers")
        controllers.start(state_dir)
        progress(f"starting cluster DNS ({dns.SERVICE_REF} at {', '.join(dns.CLUSTER_IPS)})")
        # not waited for, like the kubelet: the DNS pod, the kubelet's first, runs a few hundred ms
        # after `lab up` returns (a pod asking before then gets no answer, as in a cluster whose
        # DNS is still starting); waiting would add the kubelet's start and a CNI ADD to every up
        dnsfeed.start(state_dir)
    except BaseException:
        down(name, state_dir)
        raise
    return lab


def down(name: str, state_dir: str | None) -> None:
    if state_dir and os.path.isdir(state_dir):
        # pods first, so that nothing keeps a namespace busy; then the rest goes at once
        procs.stop_all(state_dir)
    topology.destroy(name, state_dir=state_dir)


def status(name: str, state_dir: str) -> dict[str, Any]:
    lab = topology.load(name, state_dir=state_dir)
    if lab is None:
        raise LabError(f'lab "{name}" is not running', )
    running = {p.name: p for p in procs.list_procs(state_dir)}
    out_nodes = []
    for n in lab.nodes:
        p = running.get(f"agent-{n.name}")
        health: Any = None
        try:
            st, body = call(agent_socket(state_dir, n.name), "GET", "/healthz", timeout=2)
            health = "healthy" if st == 200 and body.get("ok") else f"unhealthy: {body.get('last_error')}"
            endpoints = body.get("endpoints")
        except AgentUnavailable:
            health, endpoints = "down", None
        out_nodes.append({"name": n.name, "netns": n.netns, "underlay": n.underlay_addr, "locator": n.locator,
                          "pinRoot": n.pin_root, "agentPid": p.pid if p and p.alive else None,
                          "agent": health, "endpoints": endpoints})
    k = running.get("kubelet")
    store = lab_store(state_dir)
    etcd = {p.name: (p.pid if p.alive else None) for p in running.values() if p.name.startswith("etcd-")}
    out = {"name": name, "fabric": lab.fabric_netns, "outside": lab.outside_netns, "stateDir": state_dir,
           "store": {"backend": store.backend, "spec": str(store), "members": etcd or None},
           "nodes": out_nodes, "kubeletPid": k.pid if k and k.alive else None,
           "controllersPid": controllers.pid(state_dir), "dnsFeederPid": dnsfeed.pid(state_dir)}
    if store.backend == "k8s":
        # a lab on Kubernetes: the upstream processes, by their lab names (lace.lab.kube)
        out["kubernetes"] = {"netns": store.netns, "kubeconfig": store.kubeconfig,
                             "processes": {p.name: (p.pid if p.alive else None) for p in running.values()
                                           if p.name.startswith(("k8s-", "kubelet-", "containerd-", "holder-"))}}
    return out


def start_kubelet(name: str, state_dir: str) -> int:
    """Start the lab's kubelet (``lace.lab.kubelet``); returns its pid."""
    return procs.spawn([sys.executable, "-m", "lace.lab.kubelet", "--lab", name, "--state-dir", state_dir],
                       netns=None, name="kubelet", state_dir=state_dir,
                       log_path=os.path.join(state_dir, "logs", "kubelet.log"))


def restart_kubelet(name: str, state_dir: str, *, kill: bool = False) -> int:
    """Stop the lab's kubelet (SIGKILL with ``kill``: a runtime that crashes, mid-CNI call or not)
    and start it again; it adopts the sandboxes it recorded and finishes what it left half done.
    Returns the new pid."""
    if topology.load(name, state_dir=state_dir) is None:
        raise LabError(f'lab "{name}" is not running')
    procs.stop("kubelet", state_dir, sig=signal.SIGKILL if kill else signal.SIGTERM, timeout=5)
    return start_kubelet(name, state_dir)


def restart_agent(name: str, state_dir: str, node: str, *, kill: bool = False) -> int:
    lab = topology.load(name, state_dir=state_dir)
    if lab is None:
        raise LabError(f'lab "{name}" is not running')
    n = next((x for x in lab.nodes if x.name == node), None)
    if n is None:
        raise LabError(f'lab "{name}" has no node "{node}" (nodes: {", ".join(x.name for x in lab.nodes)})')
    procs.stop(f"agent-{node}", state_dir, sig=signal.SIGKILL if kill else signal.SIGTERM, timeout=5)
    pid = start_agent(state_dir, n)
    wait_agent(state_dir, node)
    return pid


def pod_sandbox(state_dir: str, namespace: str, name: str) -> dict:
    """The kubelet's record of a running pod: ``netns``, ``resolv_conf`` (its file), ``ips`` ..."""
    rec = Sandboxes(os.path.join(state_dir, "kubelet")).find(namespace, name)
    if rec is None or not rec.get("ready"):
        raise LabError(f"pod {namespace}/{name} is not running in this lab (lace get pods -n {namespace})")
    return rec


def pod_netns(state_dir: str, namespace: str, name: str) -> str:
    return pod_sandbox(state_dir, namespace, name)["netns"]
