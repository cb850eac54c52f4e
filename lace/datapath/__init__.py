"""Python mirrors of the datapath's C ABI (bpf/include/lace/abi), one module per header, the map
registry, and :mod:`lace.datapath.node`: the one way to reach a node's maps and program objects."""
