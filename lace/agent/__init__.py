"""lace node agent: desired state from the store, IPAM, segments, reconcile into the node's maps."""
