/* policy: allow entries between segments, per direction, protocol and port range. */
#ifndef LACE_ABI_POLICY_H
#define LACE_ABI_POLICY_H

#define LACE_POLICY_MAX 65536

/* prefixlen values: segment + peer + direction (72 bits) match any protocol and port;
 * +8 bits match one protocol; +k bits of the port (network order) match a block of ports,
 * so a port range is a handful of entries; 96 is one exact port. */
#define LACE_POLICY_PREFIX_ANY_PROTO 72
#define LACE_POLICY_PREFIX_PROTO     80
#define LACE_POLICY_PREFIX_FULL      96

#define LACE_POLICY_F_SELECTED 0x1  /* marker: the segment is selected in this direction (default deny) */
#define LACE_POLICY_F_AUDIT    0x2  /* marker: selected in audit mode, drops are reported, not enforced */

/* LPM trie key. The marker entry uses peer = LACE_SEGMENT_SELECTED, prefixlen 72. */
struct lace_policy_key {
	__u32  prefixlen;
	__u32  segment;     /* subject: source segment (egress) or destination segment (ingress) */
	__u32  peer;        /* the other side; LACE_SEGMENT_ANY for any peer */
	__u8   direction;   /* enum lace_direction */
	__u8   proto;       /* IP protocol number */
	__be16 dport;       /* destination port */
};

struct lace_policy_entry {
	__u32 policy_id;    /* the NetworkPolicy it came from (store ID) */
	__u16 rule;         /* rule index inside that policy */
	__u16 flags;        /* LACE_POLICY_F_* */
	__u64 hits;         /* new connections this entry allowed */
};

#endif
