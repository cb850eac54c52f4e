"""lace's CNI plugin: the binary a container runtime calls (CNI spec 1.1)."""
