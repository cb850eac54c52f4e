"""The cluster's certificates and kubeconfigs, made by kubeadm's own phases (``kubeadm init phase
certs all`` and ``kubeconfig``), so they are what a kubeadm cluster has: a cluster CA, the
apiserver's serving certificate (SANs: the control plane's addresses, the first ClusterIP of the
service range, ``kubernetes.default.svc...``), its clients of the kubelets and of etcd, the
front-proxy CA and client, the service-account key pair, and kubeconfigs for the controller
manager, the scheduler, an admin (group ``kubeadm:cluster-admins``, bound to cluster-admin once
the apiserver runs), the super-admin (``system:masters``) and one kubelet per node
(``system:node:<node>`` in ``system:nodes``, what the Node authorizer and NodeRestriction check)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from lace.lab import topology

from .upstream import binary


class PkiError(topology.LabError):
    """kubeadm could not make a certificate or kubeconfig; the message has its output."""


@dataclass(frozen=True)
class ClusterSpec:
    """What the certificates name: the cluster, its endpoint and service range."""

    name: str
    version: str
    advertise4: str
    advertise6: str
    port: int
    service_cidrs: tuple[str, ...]
    dns_domain: str = "cluster.local"

    @property
    def endpoint(self) -> str:
        return f"{self.advertise4}:{self.port}"


def _config(spec: ClusterSpec, pki_dir: str, node: str) -> str:
    # nodeRegistration.criSocket: kubeadm asks no runtime in these phases, but wants a value
    sans = ", ".join(f'"{a}"' for a in (spec.advertise4, spec.advertise6, "127.0.0.1", "::1"))
    return f"""apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: {spec.advertise4}
  bindPort: {spec.port}
nodeRegistration:
  name: {node}
  criSocket: unix:///run/containerd/containerd.sock
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: {spec.version}
clusterName: {spec.name}
certificatesDir: {pki_dir}
controlPlaneEndpoint: "{spec.endpoint}"
networking:
  serviceSubnet: "{','.join(spec.service_cidrs)}"
  dnsDomain: {spec.dns_domain}
apiServer:
  certSANs: [{sans}]
"""


def _kubeadm(args: list[str], config: str, work: str) -> None:
    path = os.path.join(work, "kubeadm.yaml")
    with open(path, "w") as f:
        f.write(config)
    r = subprocess.run([binary("kubeadm"), *args, "--config", path], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise PkiError(f"kubeadm {' '.join(args)} failed: {(r.stderr or r.stdout).strip()[-1500:]}")


def make_cluster(spec: ClusterSpec, directory: str) -> None:
    """``<directory>/pki`` (every certificate and key) and ``<directory>/*.conf`` (controller-manager,
    scheduler, admin, super-admin)."""
    pki = os.path.join(directory, "pki")
    os.makedirs(pki, exist_ok=True)
    config = _config(spec, pki, "control-plane")
    _kubeadm(["init", "phase", "certs", "all"], config, directory)
    for conf in ("admin", "super-admin", "controller-manager", "scheduler"):
        _kubeadm(["init", "phase", "kubeconfig", conf, "--kubeconfig-dir", directory], config, directory)


def make_kubelet(spec: ClusterSpec, directory: str, node: str, out_dir: str) -> str:
    """A kubelet kubeconfig of ``node`` (client certificate ``system:node:<node>``, signed by the
    cluster CA in ``<directory>/pki``) written to ``<out_dir>/kubelet.conf``; returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    config = _config(spec, os.path.join(directory, "pki"), node)
    _kubeadm(["init", "phase", "kubeconfig", "kubelet", "--kubeconfig-dir", out_dir], config, out_dir)
    return os.path.join(out_dir, "kubelet.conf")
