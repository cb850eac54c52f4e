"""The real-cluster tier: one lab on a real Kubernetes for the whole session (``lace lab up
--kubernetes``: the upstream control plane, containerd and a kubelet on each of three nodes, lace
installed by its Helm chart), driven through the real ``lace`` CLI in-process and the real kubectl
(``lace lab kubectl``). Independent scenarios use namespaces of their own in it. The lab is taken
down afterwards, and the session fails if that left anything of it in the kernel or running."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import LabHandle, _lab, wait_for, yaml_file

__all__ = ["Cluster", "wait_for"]


class Cluster(LabHandle):
    """A lab on Kubernetes: LabHandle's ``lace`` plus the real kubectl."""

    def kubectl(self, *args: str, check: bool = True) -> tuple[int, str]:
        rc, out, err = self.lace("lab", "kubectl", "--", *args, check=False)
        if check and rc != 0:
            raise AssertionError(f"kubectl {' '.join(args)} -> {rc}\n{out}\n{err}")
        return rc, out + err

    def kjson(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json")[1])

    def kapply(self, docs: list[dict]) -> None:
        with yaml_file(docs) as path:
            self.kubectl("apply", "-f", path)

    def kexec(self, ns: str, pod: str, *cmd: str) -> tuple[int, str]:
        return self.kubectl("exec", "-n", ns, pod, "--", *cmd, check=False)

    def ready(self, ns: str, names: list[str], timeout: float = 120) -> dict[str, dict]:
        """Wait until every named pod is Ready (its readiness probe answered the real kubelet)."""
        def check() -> dict[str, dict] | None:
            pods = {p["metadata"]["name"]: p for p in self.kjson("get", "pods", "-n", ns)["items"]}
            ok = all(any(c["type"] == "Ready" and c["status"] == "True"
                         for c in (pods.get(n, {}).get("status") or {}).get("conditions") or []) for n in names)
            return pods if ok else None
        return wait_for(check, f"pods {', '.join(names)} in {ns} Ready", timeout=timeout, interval=0.5)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    with _lab("k", "--kubernetes", handle_cls=Cluster) as handle:
        yield handle   # type: ignore[misc]


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def agnhost_pod(name: str, ns: str, node: str, *args: str, labels: dict | None = None,
                probe: bool = True) -> dict:
    """A pod of the agnhost image on ``node``: ``netexec`` (HTTP on 8080, /hostname answers the
    pod's name) unless other ``args``, with a readiness probe the real kubelet sends to it."""
    c: dict = {"name": "agnhost", "image": agnhost_image(), "imagePullPolicy": "Never",
               "args": list(args) or ["netexec", "--http-port=8080", "--udp-port=8081"]}
    if probe and not args:
        c["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels or {"app": name}},
            "spec": {"nodeName": node, "containers": [c], "terminationGracePeriodSeconds": 1}}


def agnhost_image() -> str:
    """The agnhost image deploy/image/upstream.sh made (its tag is the Kubernetes module's)."""
    images = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "build", "images")
    found = sorted(f for f in os.listdir(images) if f.startswith("agnhost-")) if os.path.isdir(images) else []
    tag = found[-1][len("agnhost-"):-len(".tar")] if found else "missing"
    return f"registry.k8s.io/e2e-test-images/agnhost:{tag}"

