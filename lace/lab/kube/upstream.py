"""The upstream binaries the real-cluster lab runs: ``build/upstream/bin`` of the repository
(``make upstream`` builds them there from upstream/*/go.mod), or ``$LACE_UPSTREAM_BIN``."""

from __future__ import annotations

import os
from pathlib import Path

from lace.lab.topology import LabError

#: the repository root (lace/lab/kube/upstream.py -> ../../..)
REPO_ROOT = Path(__file__).resolve().parents[3]

#: what the control plane and the nodes run
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubeadm", "kubectl")
NODE = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "kubelet")


class MissingBinary(LabError):
    """An upstream binary is not built; the message says which and how to build it."""


def bin_dir() -> Path:
    env = os.environ.get("LACE_UPSTREAM_BIN")
    return Path(env) if env else REPO_ROOT / "build" / "upstream" / "bin"


def binary(name: str) -> str:
    """The path of upstream binary ``name``; MissingBinary when it is not there."""
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        hint = "fix LACE_UPSTREAM_BIN or unset it" if os.environ.get("LACE_UPSTREAM_BIN") else \
            f"run `make upstream` in {REPO_ROOT} (a fresh machine takes about 10 minutes)"
        raise MissingBinary(f"{name} is not built ({path} is missing): {hint}")
    return str(path)


def require(names: tuple[str, ...] = CONTROL_PLANE + NODE) -> dict[str, str]:
    """Every one of ``names``, checked before anything starts: one error naming all that are missing."""
    missing, found = [], {}
    for n in names:
        try:
            found[n] = binary(n)
        except MissingBinary:
            missing.append(n)
    if missing:
        raise MissingBinary(f"not built: {', '.join(missing)} (in {bin_dir()}): "
                            f"run `make upstream` in {REPO_ROOT} (a fresh machine takes about 10 minutes)")
    return found


def kubernetes_version() -> str:
    """The pinned Kubernetes release (``v1.36.3``), from the version directory the binaries are in."""
    target = os.path.realpath(bin_dir() / "kube-apiserver")
    parent = os.path.basename(os.path.dirname(target))
    prefix = "kubernetes-"
    if not parent.startswith(prefix):
        raise MissingBinary(f"kube-apiserver at {target} is not in a kubernetes-<version> directory of make upstream")
    return parent[len(prefix):]
