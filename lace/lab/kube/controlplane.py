"""The real-cluster lab's control plane: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, in the network namespace ``lace-<lab>-control`` on the lab's fabric.

The namespace has the fabric addresses CONTROL4 and CONTROL6 (beside the nodes' and the
outside's). The apiserver serves on both at API_PORT, with TLS, the Node and RBAC authorizers,
service-account tokens, bootstrap tokens, the front proxy, and the default admission plugins (Pod
Security among them) plus NodeRestriction, as kubeadm configures it. etcd (one member, plain HTTP)
and the health ports of the controller manager and the scheduler listen on loopback only: nothing
outside the namespace reaches them. The controller manager signs with the cluster CA, runs every
controller with its own service account, and allocates no pod CIDRs (lace's IPAM gives pod
addresses); there is no kube-proxy (lace programs Services).

Every process is a lab process (``lace.lab.procs``): ``lace lab down`` stops it with the rest."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
from dataclasses import dataclass
from typing import Callable

from lace import netlink as nl
from lace import nsenter
from lace.lab import procs, topology
from lace.store import kinds as K

from . import pki
from .upstream import binary, kubernetes_version

#: the control plane's addresses on the fabric (the nodes have 1.., the outside .254 / ::fe)
CONTROL4 = "198.18.0.253"
CONTROL6 = "fd5e:ff::fd"
API_PORT = 6443
CONTROL_PORT = "upcp"
ETCD_CLIENT = "http://127.0.0.1:2379"
ETCD_PEER = "http://127.0.0.1:2380"
#: how long `lab up` waits for the apiserver to be ready (it is about a second here)
READY_TIMEOUT = 90.0
#: the group kubeadm's admin.conf is in, and the binding that makes it cluster-admin
ADMINS_GROUP = "kubeadm:cluster-admins"

Progress = Callable[[str], None]


class ControlPlaneError(topology.LabError):
    """The control plane did not come up; the message names the component and its log."""


@dataclass(frozen=True)
class ControlPlane:
    """Where a lab's control plane is: its namespace, directory (certificates, kubeconfigs, etcd
    data) and the apiserver's URL."""

    lab: str
    netns: str
    directory: str

    @property
    def server(self) -> str:
        return f"https://{CONTROL4}:{API_PORT}"

    @property
    def admin_kubeconfig(self) -> str:
        """Bound to cluster-admin by RBAC (what users and lace's own tools use)."""
        return os.path.join(self.directory, "admin.conf")

    @property
    def super_admin_kubeconfig(self) -> str:
        """In ``system:masters``, past RBAC: only to bootstrap the admins' binding."""
        return os.path.join(self.directory, "super-admin.conf")

    @property
    def pki_dir(self) -> str:
        return os.path.join(self.directory, "pki")


def control_plane(lab: str, state_dir: str) -> ControlPlane:
    return ControlPlane(lab=lab, netns=topology.netns_name(lab, "control"),
                        directory=os.path.join(state_dir, "kubernetes"))


def cluster_spec(lab: str) -> pki.ClusterSpec:
    return pki.ClusterSpec(name=f"lace-{lab}", version=kubernetes_version(), advertise4=CONTROL4,
                           advertise6=CONTROL6, port=API_PORT, service_cidrs=tuple(K.DEFAULT_SERVICE_CIDRS))


def build_netns(lab: str) -> str:
    """``lace-<lab>-control`` on the fabric with CONTROL4 and CONTROL6."""
    ns = topology.netns_name(lab, "control")
    nl.create_netns(ns)
    for scope in ("all", "default"):
        nl.sysctl(ns, f"net.ipv6.conf.{scope}.accept_dad", 0)
    nl.set_up("lo", ns)
    topology.attach_to_fabric(lab, ns, CONTROL_PORT, "control")
    nl.add_address(topology.UPLINK, f"{CONTROL6}/{topology.UNDERLAY_PREFIXLEN}", ns)
    nl.add_address(topology.UPLINK, f"{CONTROL4}/{topology.UNDERLAY4_PREFIXLEN}", ns)
    nl.set_up(topology.UPLINK, ns)
    nl.wait_link(topology.UPLINK, ns, timeout=10, up=True)
    nl.wait_link(CONTROL_PORT, topology.netns_name(lab, "fabric"), timeout=10, up=True)
    return ns


def _argv(cp: ControlPlane, spec: pki.ClusterSpec) -> dict[str, list[str]]:
    d, p = cp.directory, cp.pki_dir
    ranges = ",".join(spec.service_cidrs)

    def delegated(conf: str) -> list[str]:   # who may call their own endpoints: asked of the apiserver
        return [f"--authentication-kubeconfig={conf}", f"--authorization-kubeconfig={conf}"]
    return {
        "etcd": [
            binary("etcd"), "--name", "control", "--data-dir", os.path.join(d, "etcd"),
            "--listen-client-urls", ETCD_CLIENT, "--advertise-client-urls", ETCD_CLIENT,
            "--listen-peer-urls", ETCD_PEER, "--initial-advertise-peer-urls", ETCD_PEER,
            "--initial-cluster", f"control={ETCD_PEER}", "--initial-cluster-state", "new",
            # a lab's etcd: losing the last writes on a machine crash loses nothing of value, and
            # fsync on every write makes every apiserver write wait on the disk
            "--unsafe-no-fsync", "--snapshot-count", "10000", "--log-level", "warn",
        ],
        "kube-apiserver": [
            binary("kube-apiserver"),
            f"--advertise-address={CONTROL4}", "--bind-address=::", f"--secure-port={API_PORT}",
            f"--etcd-servers={ETCD_CLIENT}",
            f"--service-cluster-ip-range={ranges}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true", "--enable-bootstrap-token-auth=true",
            f"--client-ca-file={p}/ca.crt",
            f"--tls-cert-file={p}/apiserver.crt", f"--tls-private-key-file={p}/apiserver.key",
            f"--kubelet-client-certificate={p}/apiserver-kubelet-client.crt",
            f"--kubelet-client-key={p}/apiserver-kubelet-client.key",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-account-issuer=https://kubernetes.default.svc.{spec.dns_domain}",
            f"--service-account-key-file={p}/sa.pub", f"--service-account-signing-key-file={p}/sa.key",
            f"--requestheader-client-ca-file={p}/front-proxy-ca.crt",
            f"--proxy-client-cert-file={p}/front-proxy-client.crt",
            f"--proxy-client-key-file={p}/front-proxy-client.key",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--requestheader-group-headers=X-Remote-Group", "--requestheader-username-headers=X-Remote-User",
        ],
        "kube-controller-manager": [
            binary("kube-controller-manager"),
            f"--kubeconfig={d}/controller-manager.conf",
            *delegated(f"{d}/controller-manager.conf"),
            "--bind-address=127.0.0.1", "--leader-elect=true", "--use-service-account-credentials=true",
            "--controllers=*,bootstrapsigner,tokencleaner", "--allocate-node-cidrs=false",
            f"--service-cluster-ip-range={ranges}", f"--cluster-name={spec.name}",
            f"--client-ca-file={p}/ca.crt", f"--requestheader-client-ca-file={p}/front-proxy-ca.crt",
            f"--cluster-signing-cert-file={p}/ca.crt", f"--cluster-signing-key-file={p}/ca.key",
            f"--root-ca-file={p}/ca.crt", f"--service-account-private-key-file={p}/sa.key",
        ],
        "kube-scheduler": [
            binary("kube-scheduler"),
            f"--kubeconfig={d}/scheduler.conf",
            *delegated(f"{d}/scheduler.conf"),
            "--bind-address=127.0.0.1", "--leader-elect=true",
        ],
    }


def proc_name(component: str) -> str:
    return f"k8s-{component}"


def _get(netns: str, host: str, port: int, path: str, context: ssl.SSLContext, timeout: float = 2.0) -> tuple[int, str]:
    """GET https://host:port/path from inside ``netns``: (status, body); (0, error) when no answer."""
    import http.client
    try:
        with nsenter.entered(netns):
            sock = socket.create_connection((host, port), timeout=timeout)
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
        conn.sock = context.wrap_socket(sock, server_hostname=host)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode(errors="replace")
        finally:
            conn.close()
    except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
        return 0, str(exc)


def _ready(check: Callable[[], tuple[int, str]]) -> Callable[[], str | None]:
    """procs.wait_started's ``pending`` of an HTTP check: None on 200, else what it answered."""
    def pending() -> str | None:
        status, body = check()
        return None if status == 200 else f"{status or 'no answer'}: {body.strip()[-300:]}"
    return pending


def _wait(what: str, check: Callable[[], tuple[int, str]], state_dir: str, timeout: float) -> None:
    procs.wait_started(proc_name(what), state_dir, _ready(check), what, timeout, ControlPlaneError)


def kubectl(cp: ControlPlane, *args: str, kubeconfig: str | None = None, timeout: float = 60.0,
            stdin: str | None = None) -> procs.Completed:
    """Run the real kubectl against the lab's apiserver, inside the control plane's namespace."""
    argv = [binary("kubectl"), f"--kubeconfig={kubeconfig or cp.admin_kubeconfig}", *args]
    return procs.run(argv, netns=cp.netns, timeout=timeout, input=stdin, output_limit=64 << 20)


def start(lab: str, state_dir: str, progress: Progress = lambda s: None) -> ControlPlane:
    """Certificates, namespace, etcd, apiserver (waited for: /readyz), the admins' binding, then the
    controller manager and the scheduler (waited for: /healthz)."""
    cp = control_plane(lab, state_dir)
    spec = cluster_spec(lab)
    # a new cluster: nothing of an earlier one in this state dir (its etcd data, its certificates)
    shutil.rmtree(cp.directory, ignore_errors=True)
    progress("making the cluster's certificates (kubeadm init phase certs, kubeconfig)")
    pki.make_cluster(spec, cp.directory)
    build_netns(lab)
    argv = _argv(cp, spec)
    ca = ssl.create_default_context(cafile=os.path.join(cp.pki_dir, "ca.crt"))
    for component in ("etcd", "kube-apiserver"):
        progress(f"starting {component}")
        procs.spawn(argv[component], netns=cp.netns, name=proc_name(component), state_dir=state_dir,
                    log_path=procs.log_file(state_dir, proc_name(component)))
    _wait("kube-apiserver", lambda: _get(cp.netns, CONTROL4, API_PORT, "/readyz", ca), state_dir, READY_TIMEOUT)
    progress("kube-apiserver is ready")
    # the two bindings kubeadm makes: its admins are cluster-admin; the apiserver's client of the
    # kubelets may use their API (exec, logs, port-forward go through it)
    for args in (("create", "clusterrolebinding", ADMINS_GROUP, "--clusterrole=cluster-admin", f"--group={ADMINS_GROUP}"),
                 ("create", "clusterrolebinding", "kubeadm:apiserver-kubelet-client",
                  "--clusterrole=system:kubelet-api-admin", "--user=kube-apiserver-kubelet-client")):
        binding = kubectl(cp, *args, kubeconfig=cp.super_admin_kubeconfig)
        if binding.returncode != 0:
            raise ControlPlaneError(f"cannot create clusterrolebinding {args[2]}: {binding.output.strip()}")
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE   # their serving certificates are self-signed, loopback only
    for component, port in (("kube-controller-manager", 10257), ("kube-scheduler", 10259)):
        progress(f"starting {component}")
        procs.spawn(argv[component], netns=cp.netns, name=proc_name(component), state_dir=state_dir,
                    log_path=procs.log_file(state_dir, proc_name(component)))
    for component, port in (("kube-controller-manager", 10257), ("kube-scheduler", 10259)):
        _wait(component, lambda port=port: _get(cp.netns, "127.0.0.1", port, "/healthz", insecure),
              state_dir, READY_TIMEOUT)
    progress("the control plane is up")
    return cp


def running(state_dir: str) -> dict[str, bool]:
    """Whether each control-plane process runs."""
    return {c: procs.running(proc_name(c), state_dir)
            for c in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")}


def stop(state_dir: str) -> None:
    """Stop the control plane's processes, scheduler first, etcd last."""
    for c in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        with contextlib.suppress(procs.ProcError):
            procs.stop(proc_name(c), state_dir)
