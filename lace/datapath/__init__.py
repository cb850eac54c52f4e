"""Python mirrors of the datapath's C ABI (bpf/include/lace/abi), one module per header, and the map registry."""
