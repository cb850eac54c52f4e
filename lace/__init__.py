"""lace: an eBPF Kubernetes networking data plane with a Python control plane."""

__version__ = "0.1.0"
