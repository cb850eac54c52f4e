"""The lab on a real Kubernetes (``lace lab up --kubernetes``): the upstream control plane in a
network namespace of its own on the lab's fabric, and on every node a containerd and a kubelet in
that node's namespaces, all built from their Go modules (``make upstream``).

- ``upstream``: where the built binaries are, and the versions they were built at;
- ``pki``: the cluster's certificates and kubeconfigs, made by kubeadm's own phases;
- ``controlplane``: etcd, kube-apiserver, kube-controller-manager and kube-scheduler;
- ``node``: a node's holder (its mount and UTS namespaces), containerd and kubelet.

Stdlib only at import, like the rest of ``lace.lab`` (the CLI imports it for every lab command).
"""
