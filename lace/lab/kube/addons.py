"""The real-cluster lab's add-on: CoreDNS as the cluster DNS, as kubeadm deploys it — the
Deployment ``kube-system/coredns`` behind the Service ``kube-system/kube-dns`` at the ClusterIPs
the kubelets hand to pods (``lace.lab.dns.CLUSTER_IPS``, both families), its RBAC, and a
Corefile that serves cluster.local and the reverse zones. There is no ``forward``: the lab has no
upstream resolver, and nothing of it may ask outside its namespaces. lace programs the Service
(there is no kube-proxy), and the real kubelet probes CoreDNS's health and readiness ports through
lace's probe path."""

from __future__ import annotations

from typing import Any

from lace.lab.dns import CLUSTER_IPS

COREDNS_LABELS = {"k8s-app": "kube-dns"}

COREFILE = """.:53 {
    errors
    health {
        lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    prometheus :9153
    cache 30
    loop
    reload
    loadbalance
}
"""


def coredns(image: str) -> list[dict[str, Any]]:
    """The objects, in the order they are applied. CoreDNS reaches the apiserver as any in-cluster
    client does: through the ``kubernetes`` Service, whose endpoint (the apiserver, outside every
    pod network) lace translates to and masquerades out of the node."""
    ns = "kube-system"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:coredns"},
         "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": ns}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", "namespace": ns},
         "data": {"Corefile": COREFILE}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "coredns", "namespace": ns,
                                                                     "labels": COREDNS_LABELS},
         "spec": {
             "replicas": 2,
             "selector": {"matchLabels": COREDNS_LABELS},
             "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
             "template": {
                 "metadata": {"labels": COREDNS_LABELS},
                 "spec": {
                     "serviceAccountName": "coredns",
                     "priorityClassName": "system-cluster-critical",
                     "dnsPolicy": "Default",
                     "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                         {"weight": 100, "podAffinityTerm": {
                             "labelSelector": {"matchLabels": COREDNS_LABELS},
                             "topologyKey": "kubernetes.io/hostname"}}]}},
                     "containers": [{
                         "name": "coredns", "image": image, "imagePullPolicy": "Never",
                         "args": ["-conf", "/etc/coredns/Corefile"],
                         "ports": [{"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                   {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                                   {"name": "metrics", "containerPort": 9153, "protocol": "TCP"}],
                         "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "initialDelaySeconds": 10,
                                           "periodSeconds": 10, "failureThreshold": 5},
                         "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                         "resources": {"requests": {"cpu": "50m", "memory": "70Mi"}, "limits": {"memory": "170Mi"}},
                         "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                             "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}},
                         "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
                     }],
                     "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                 }}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube-dns", "namespace": ns,
                                                             "labels": COREDNS_LABELS},
         "spec": {"selector": COREDNS_LABELS, "clusterIP": CLUSTER_IPS[0], "clusterIPs": list(CLUSTER_IPS),
                  "ipFamilyPolicy": "RequireDualStack",
                  "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                            {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153}]}},
    ]
