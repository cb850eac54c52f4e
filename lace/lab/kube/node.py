"""A real-cluster lab node: its holder (mount and UTS namespaces, ``lace.lab.kube.holder``), its
containerd and its kubelet, all in the node's network namespace.

What keeps two nodes of one machine apart, as two machines are:

- **paths**: the holder binds the node's own directories (under ``<state>/nodes/<node>/``) over the
  paths a DaemonSet's hostPath volumes and the CNI name the same on every node: /opt/cni/bin,
  /etc/cni/net.d, /run/netns (pod network namespaces), /run/lace (the agent's socket),
  /run/containerd (containerd's state and socket), /sys/fs/bpf (the node's pin root,
  /sys/fs/bpf/lace-<lab>-<node>) and HOST_CGROUP (the node's host cgroup, for the agent's socket
  hooks). containerd's root and the kubelet's root and pod-logs directories are per node by
  their own settings.
- **hostname**: the node's name, in its UTS namespace (hostNetwork pods see it).
- **cgroups**: each kubelet has a cgroup root of its own (CGROUP_ROOT), so no kubelet sees another
  node's pods as its own to kill. This machine's controllers are on cgroup v1 (cgroup2 at
  /sys/fs/cgroup/unified holds none), so the kubelet runs in v1 mode (``failCgroupV1: false``)
  with the cgroupfs driver. The pods' cgroups are not under the node's host cgroup: the host's
  socket hooks never apply to a pod. The kubelet itself runs in the node's kubelet cgroup, the one
  cgroup whose sockets lace lets probe pods of isolated networks.
- **credentials**: a client certificate per kubelet, ``system:node:<node>`` (``lace.lab.kube.pki``).

The kubelet reports the node's fabric addresses as its InternalIPs (IPv4 and IPv6) and asks the
CRI for the network: the node stays NotReady until a CNI configuration is in its /etc/cni/net.d,
which only lace's DaemonSet puts there."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

from lace.lab import procs, topology
from lace.lab.dns import CLUSTER_IPS

from . import pki
from .controlplane import ControlPlane, cluster_spec
from .upstream import bin_dir, binary

#: where the node's host cgroup (cgroup2) is bound inside the node: the chart's node.cgroupRoot
HOST_CGROUP = "/run/lace-lab/host-cgroup"
#: the pause image the kubelet's sandboxes run (built from the Kubernetes module's build/pause)
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"
READY_TIMEOUT = 60.0


class NodeError(topology.LabError):
    """A node's holder, containerd or kubelet did not come up; the message names it and its log."""


@dataclass(frozen=True)
class KubeNode:
    """A node's directories and names."""

    lab: str
    name: str
    state_dir: str
    netns: str
    host_cgroup: str
    underlay4: str
    underlay6: str

    @property
    def directory(self) -> str:
        return os.path.join(self.state_dir, "nodes", self.name)

    def path(self, *parts: str) -> str:
        return os.path.join(self.directory, *parts)

    @property
    def ready_file(self) -> str:
        return self.path("holder.ready")

    @property
    def containerd_socket(self) -> str:
        return "/run/containerd/containerd.sock"   # inside the node (the holder binds /run/containerd)

    @property
    def containerd_socket_outside(self) -> str:
        """The same socket as the machine's own mount namespace reaches it."""
        return self.path("run-containerd", "containerd.sock")

    @property
    def agent_socket(self) -> str:
        return agent_socket(self.state_dir, self.name)

    @property
    def cgroup_root(self) -> str:
        """The kubelet's --cgroup-root (in every hierarchy): ``/lace-<lab>/pods-<node>``, beside
        the node's host cgroup ``/lace-<lab>/<node>``, inside the lab's cgroup that ``lab down``
        removes."""
        return f"/lace-{self.lab}/pods-{self.name}"

    @property
    def binds(self) -> list[tuple[str, str]]:
        return [(self.path("cni-bin"), "/opt/cni/bin"), (self.path("cni-conf"), "/etc/cni/net.d"),
                (self.path("netns"), "/run/netns"), (self.path("run-lace"), "/run/lace"),
                (self.path("run-containerd"), "/run/containerd"),
                (topology.pin_root(self.lab, self.name), topology.BPFFS),
                (self.host_cgroup, HOST_CGROUP)]


def kube_node(lab: Any, node: Any, state_dir: str) -> KubeNode:
    return KubeNode(lab=lab.name, name=node.name, state_dir=state_dir, netns=node.netns, host_cgroup=node.cgroup,
                    underlay4=node.underlay_addr4, underlay6=node.underlay_addr)


#: the lab process names of a node's parts: ``holder-<node>``, ``containerd-<node>``, ``kubelet-<node>``
HOLDER, CONTAINERD, KUBELET = "holder", "containerd", "kubelet"


def proc_name(part: str, node: str) -> str:
    return f"{part}-{node}"


def agent_socket(state_dir: str, node: str) -> str:
    """The node's agent socket as the machine reaches it: the lace-node pod's hostPath /run/lace is
    the node's own run-lace directory."""
    return os.path.join(state_dir, "nodes", node, "run-lace", "agent.sock")


def _path_env() -> dict[str, str]:
    """The environment with the upstream binaries first on PATH (containerd finds its shim there,
    the kubelet its runtime's tools)."""
    return dict(os.environ, PATH=f"{bin_dir()}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}")


def holder_pid(n: KubeNode) -> int:
    with open(n.ready_file) as f:
        return int(f.read())


def _entered(n: KubeNode, argv: list[str]) -> list[str]:
    """``argv`` inside the node: its holder's mount and UTS namespaces (the network one the
    spawned process is in already)."""
    return ["nsenter", "-t", str(holder_pid(n)), "-m", "-u", "--", *argv]


def _wait(n: KubeNode, name: str, ready: Any, what: str, timeout: float = READY_TIMEOUT) -> None:
    procs.wait_started(name, n.state_dir, lambda: None if ready() else "not yet", f"{what} on {n.name}",
                       timeout, NodeError)


def start_holder(n: KubeNode) -> None:
    import sys
    argv = [sys.executable, "-m", "lace.lab.kube.holder", "--hostname", n.name, "--ready", n.ready_file]
    for source, target in n.binds:
        argv += ["--bind", f"{source}:{target}"]
    name = proc_name(HOLDER, n.name)
    procs.spawn(argv, netns=n.netns, name=name, state_dir=n.state_dir, log_path=procs.log_file(n.state_dir, name))
    _wait(n, name, lambda: os.path.exists(n.ready_file), "the holder")


def containerd_config(n: KubeNode) -> str:
    runc = binary("runc")
    return f"""version = 3
root = "{n.path('containerd-root')}"
state = "/run/containerd"

[grpc]
  address = "{n.containerd_socket}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # no container gets an OOM score below containerd's own: lowering one needs CAP_SYS_RESOURCE,
  # which root on these machines lacks (the kubelet asks -998 for every sandbox)
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
    # the pod's lo comes up by containerd itself: the node has no CNI plugins but lace's (a
    # distribution's kubernetes-cni package would put a loopback plugin there)
    use_internal_loopback = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def start_containerd(n: KubeNode) -> None:
    path = n.path("containerd.toml")
    with open(path, "w") as f:
        f.write(containerd_config(n))
    name = proc_name(CONTAINERD, n.name)
    procs.spawn(_entered(n, [binary("containerd"), "--config", path]), netns=n.netns, name=name,
                state_dir=n.state_dir, log_path=procs.log_file(n.state_dir, name), env=_path_env(),
                cgroup=n.host_cgroup)
    _wait(n, name, lambda: os.path.exists(n.containerd_socket_outside), "containerd")


def kubelet_config(n: KubeNode, cp: ControlPlane) -> str:
    dns = ", ".join(f'"{a}"' for a in CLUSTER_IPS)
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: "{cp.pki_dir}/ca.crt"}}
authorization: {{mode: Webhook}}
address: "::"
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
containerRuntimeEndpoint: "unix://{n.containerd_socket}"
cgroupDriver: cgroupfs
cgroupRoot: "{n.cgroup_root}"
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
clusterDNS: [{dns}]
clusterDomain: cluster.local
resolvConf: ""
podLogsDir: "{n.path('pod-logs')}"
rotateCertificates: false
serverTLSBootstrap: false
# the nodes share one machine's disk: eviction on its fill level would evict every node's pods at
# once, for a disk no node owns
evictionHard: {{memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
"""


def start_kubelet(n: KubeNode, cp: ControlPlane) -> None:
    kubeconfig = pki.make_kubelet(cluster_spec(n.lab), cp.directory, n.name, n.path("pki"))
    config = n.path("kubelet.yaml")
    with open(config, "w") as f:
        f.write(kubelet_config(n, cp))
    name = proc_name(KUBELET, n.name)
    argv = [binary("kubelet"), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={n.path('kubelet')}", f"--cert-dir={n.path('kubelet-pki')}",
            f"--hostname-override={n.name}", f"--node-ip={n.underlay4},{n.underlay6}", "--v=1"]
    procs.spawn(_entered(n, argv), netns=n.netns, name=name, state_dir=n.state_dir,
                log_path=procs.log_file(n.state_dir, name), env=_path_env(),
                cgroup=topology.kubelet_cgroup(n.host_cgroup))


def make_cgroup_root(n: KubeNode) -> None:
    """The kubelet's cgroup root in every hierarchy (the kubelet wants it to exist)."""
    for h in topology.cgroup_hierarchies():
        os.makedirs(os.path.join(h, n.cgroup_root.lstrip("/")), exist_ok=True)


def start(n: KubeNode, cp: ControlPlane) -> None:
    """Holder, containerd (waited for: its socket), kubelet (not waited for: it registers the node)."""
    for d in ("cni-bin", "cni-conf", "netns", "run-lace", "run-containerd", "pod-logs"):
        os.makedirs(n.path(d), exist_ok=True)
    make_cgroup_root(n)
    start_holder(n)
    start_containerd(n)
    start_kubelet(n, cp)


def stop(state_dir: str, node: str) -> None:
    for name in (proc_name(KUBELET, node), proc_name(CONTAINERD, node), proc_name(HOLDER, node)):
        with contextlib.suppress(procs.ProcError):
            procs.stop(name, state_dir)
