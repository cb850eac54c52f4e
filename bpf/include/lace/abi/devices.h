/* devices: interfaces lace manages on the node, with their role and MAC. */
#ifndef LACE_ABI_DEVICES_H
#define LACE_ABI_DEVICES_H

#define LACE_DEVICES_MAX 4096

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

#endif
