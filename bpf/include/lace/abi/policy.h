/* policy: allow entries between segments, per direction, protocol and port range, in two maps.
 *
 * One key shape, struct lace_policy_key, serves both maps. Its prefix length says what an entry
 * matches: segment + peer + direction (72 bits) any protocol and port; +8 bits one protocol (80);
 * +k bits of the port (network order) a block of ports, so a port range is a handful of entries;
 * 96 one exact port. Where an entry lives depends on that length alone:
 *
 * - lace_pol_exact (a hash): the selection markers and every entry of length 72, 80 or 96, keyed
 *   with the bits past the prefix length zero. A check probes it with exact keys, so its cost does
 *   not grow with the number of entries a segment has;
 * - lace_policy (an LPM trie): only port blocks (lengths 81 to 95), which no exact key can find.
 *
 * A segment's marker says which of these a check must probe for it in that direction, for a named
 * peer (LACE_POLICY_F_PORTS .. _BLOCKS) and for any peer (the same bits shifted by
 * LACE_POLICY_ANY_PEER_SHIFT): a check never pays for a kind of entry the segment has none of,
 * never walks the trie for a segment without port ranges, and skips the any-peer probes of a
 * segment whose rules all name their peers. */
#ifndef LACE_ABI_POLICY_H
#define LACE_ABI_POLICY_H

/* Capacity of each map: the agent cuts the entries of both together to this many, so either can
 * take all of them however they split. */
#define LACE_POLICY_MAX 65536

#define LACE_POLICY_PREFIX_ANY_PROTO 72
#define LACE_POLICY_PREFIX_PROTO     80
#define LACE_POLICY_PREFIX_FULL      96

#define LACE_POLICY_F_SELECTED  0x1   /* marker: the segment is selected in this direction (default deny) */
#define LACE_POLICY_F_AUDIT     0x2   /* marker: selected in audit mode, drops are reported, not enforced */
/* marker: the segment has allow entries of this kind for a named peer in this direction, so a
 * check looks for them */
#define LACE_POLICY_F_PORTS     0x4   /* exact ports (prefix length 96, lace_pol_exact) */
#define LACE_POLICY_F_PROTOS    0x8   /* whole protocols (80, lace_pol_exact) */
#define LACE_POLICY_F_ANY_PROTO 0x10  /* any protocol (72, lace_pol_exact) */
#define LACE_POLICY_F_BLOCKS    0x20  /* port blocks of ranges (81..95, lace_policy) */
/* marker: the same kinds for peer LACE_SEGMENT_ANY, F_PORTS .. F_BLOCKS shifted by this */
#define LACE_POLICY_ANY_PEER_SHIFT 4
#define LACE_POLICY_F_ANY_PEER_PORTS     0x40
#define LACE_POLICY_F_ANY_PEER_PROTOS    0x80
#define LACE_POLICY_F_ANY_PEER_ANY_PROTO 0x100
#define LACE_POLICY_F_ANY_PEER_BLOCKS    0x200

/* Key of both maps. The marker entry uses peer = LACE_SEGMENT_SELECTED, prefixlen 72, and lives
 * in lace_pol_exact. */
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
