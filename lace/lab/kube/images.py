"""The real-cluster lab's container images, brought to every node without a registry: the archives
``deploy/image/upstream.sh`` makes (pause, agnhost, CoreDNS, lace's own) imported into each
node's containerd (namespace ``k8s.io``, where the kubelet's CRI looks) and pinned, so the
kubelet's image garbage collection never removes one (a pod's ``imagePullPolicy`` then finds it
present; nothing is ever pulled)."""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass

from lace.lab import topology

from .node import KubeNode
from .upstream import REPO_ROOT, binary

SCRIPT = REPO_ROOT / "deploy" / "image" / "upstream.sh"
LACE_IMAGE = REPO_ROOT / "deploy" / "image" / "build.sh"
PINNED_LABEL = "io.cri-containerd.pinned=pinned"
CONTAINERD_NAMESPACE = "k8s.io"


class ImageError(topology.LabError):
    """An image could not be made or imported; the message names it and what to do."""


@dataclass(frozen=True)
class Archive:
    image: str
    path: str


def archives() -> list[Archive]:
    """Build lace's image (``make image``: podman's layer cache makes an unchanged tree cheap), then
    make (or find) every image's archive."""
    r = subprocess.run([str(LACE_IMAGE)], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise ImageError(f"cannot build lace's image ({LACE_IMAGE}): {(r.stderr or r.stdout).strip()[-1500:]}")
    r = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise ImageError(f"cannot make the lab's images ({SCRIPT}): {(r.stderr or r.stdout).strip()[-1500:]}")
    out = []
    for line in r.stdout.splitlines():
        image, _, path = line.partition(" ")
        if path:
            out.append(Archive(image, path))
    return out


def _ctr(n: KubeNode, *args: str, timeout: float = 600) -> None:
    argv = [binary("ctr"), "--address", n.containerd_socket_outside, "-n", CONTAINERD_NAMESPACE, *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise ImageError(f"{n.name}: ctr {' '.join(args)} failed: {(r.stderr or r.stdout).strip()[-800:]}")


def import_into(n: KubeNode, images: list[Archive]) -> None:
    for a in images:
        _ctr(n, "images", "import", a.path)
        _ctr(n, "images", "label", a.image, PINNED_LABEL)


def import_all(nodes: list[KubeNode], images: list[Archive]) -> None:
    """Every image into every node, the nodes at once; the first failure is raised."""
    errors: list[BaseException] = []

    def one(n: KubeNode) -> None:
        try:
            import_into(n, images)
        except BaseException as exc:   # noqa: BLE001 - raised in the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n,), name=f"import-{n.name}") for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
