/* config: the node's own identity — locator prefix, underlay address, node ID, MTU. */
#ifndef LACE_ABI_CONFIG_H
#define LACE_ABI_CONFIG_H

#define LACE_CONFIG_MAX 1

/* Datapath option bits in lace_config.flags. */
#define LACE_CFG_F_TRACE_ALL  0x01  /* emit a trace event for every packet, not only new flows and drops */

/* Array map, one entry at index 0. SIDs inside the locator carry the destination network in the
 * function (the 4 bytes after the locator) and the source network in the argument (the next 4). */
struct lace_config {
	__u8  locator[16];       /* this node's locator prefix */
	__u8  underlay_addr[16]; /* outer source address of encapsulated packets */
	__u32 node_id;
	__u32 uplink_ifindex;
	__u16 mtu;               /* pod MTU (underlay MTU - 40) */
	__u8  locator_len;       /* prefix length in bits: a multiple of 8, at most 64 */
	__u8  flags;             /* LACE_CFG_F_* */
	__u8  addr4[4];          /* the node's IPv4 address: IPv4 masquerade source (0.0.0.0: none) */
	__u64 kubelet_cgroup;    /* cgroup ID of the kubelet: only its sockets may open probes into a
				  * pod of another network (0: any process of the host cgroup) */
};

#endif
