/* probes and probe-cookie: kubelet probe targets and in-flight probe connections. */
#ifndef LACE_ABI_PROBES_H
#define LACE_ABI_PROBES_H

#define LACE_PROBES_MAX       16384
#define LACE_PROBE_COOKIE_MAX 65536

/* The (pod address, port) the host connects to -> where the probe really goes. */
struct lace_probe_key {
	__u8   addr[16];
	__be16 port;
	__u8   proto;
	__u8   family;
};

/* lace_probe.flags */
/* The entry keyed (probe address, port 0, proto 0) marks an address as a probe address: a packet
 * to it on any port or protocol that has no entry of its own is denied (PROBE_DENIED). */
#define LACE_PROBE_F_ADDRESS 0x1

struct lace_probe {
	__u32  network;
	__u32  endpoint_id;
	__u32  ifindex;       /* host side of the pod's veth */
	__u8   target_addr[16];
	__be16 target_port;
	__u16  flags;
};

struct lace_probe_cookie_key {
	__u64 cookie;         /* socket cookie of the probing socket */
};

struct lace_probe_cookie {
	__u8   orig_addr[16]; /* destination the host asked for */
	__be16 orig_port;
	__u8   family;
	__u8   proto;
	__u32  network;
	__u64  created_ns;
};

#endif
