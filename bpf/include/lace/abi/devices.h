/* devices: interfaces lace manages on the node, with their role and MAC; nexthops: where the
 * underlay sends a SID, as the node's FIB last said. */
#ifndef LACE_ABI_DEVICES_H
#define LACE_ABI_DEVICES_H

#define LACE_DEVICES_MAX 4096
#define LACE_NEXTHOPS_MAX 4096
/* How long a nexthops entry stands in for the FIB: 100 ms */
#define LACE_NEXTHOP_TTL_NS 100000000ULL

enum lace_device_role {
	LACE_ROLE_POD_VETH = 1, /* host side of a pod's veth */
	LACE_ROLE_UPLINK   = 2, /* the node's underlay interface */
	LACE_ROLE_HOST     = 3, /* the host device for host <-> pod traffic */
};

struct lace_device_key {
	__u32 ifindex;
};

struct lace_device {
	__u8 mac[6];
	__u8 role;   /* enum lace_device_role */
	__u8 flags;
};

/* The datapath's own cache of the underlay's answer for an SRv6 destination (lib/srv6.h): the
 * outer header's destination (a remote node's SID) -> the interface, MACs and MTU that the node's
 * FIB gave for it, until expires_ns (the coarse monotonic clock). Written by the datapath only. */
struct lace_nexthop_key {
	__u8 sid[16];
};

struct lace_nexthop {
	__u64 expires_ns;
	__u32 ifindex;
	__u32 mtu;    /* of ifindex, as the FIB lookup reported it */
	__u8  smac[6];
	__u8  dmac[6];
	__u32 pad;
};

#endif
