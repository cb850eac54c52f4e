/* veth: pod interface -> endpoint, network, source segment and the addresses it may send from. */
#ifndef LACE_ABI_ENDPOINT_H
#define LACE_ABI_ENDPOINT_H

#define LACE_VETH_MAX 4096

#define LACE_EP_F_IPV4  0x1  /* ipv4 is set */
#define LACE_EP_F_IPV6  0x2  /* ipv6 is set */

struct lace_veth_key {
	__u32 ifindex;      /* host side of the pod's veth */
};

struct lace_endpoint {
	__u32 endpoint_id;
	__u32 network;
	__u32 segment;
	__u32 flags;        /* LACE_EP_F_* */
	__u8  mac[6];       /* the pod's MAC */
	__u16 ct_max;       /* the most conntrack flows it may hold per table (endpoint-ct); 0: no limit */
	__u8  ipv4[4];
	__u8  ipv6[16];
};

#endif
