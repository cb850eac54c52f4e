/* services and backends: (VIP, port, protocol, source network) -> backends by slot. */
#ifndef LACE_ABI_SERVICES_H
#define LACE_ABI_SERVICES_H

#define LACE_SERVICES_MAX 65536
#define LACE_BACKENDS_MAX 65536

#define LACE_SVC_F_NODEPORT 0x1
#define LACE_SVC_F_LOCAL    0x2   /* externalTrafficPolicy/internalTrafficPolicy Local */

#define LACE_BACKEND_F_ACTIVE      0x1
#define LACE_BACKEND_F_TERMINATING 0x2

/* slot 0 is the service itself; slots 1..backend_count point at backends. */
struct lace_service_key {
	__u32  network;     /* the source network this VIP serves */
	__u8   addr[16];
	__be16 port;
	__u8   proto;
	__u8   family;
	__u16  slot;
	__u16  reserved;
};

struct lace_service {
	__u32 service_id;
	__u32 backend_id;     /* slot > 0: the backend in this slot */
	__u16 backend_count;  /* slot 0: number of backend slots */
	__u16 flags;          /* LACE_SVC_F_* */
	__u32 reserved;
};

struct lace_backend_key {
	__u32 backend_id;
};

struct lace_backend {
	__u8   addr[16];
	__be16 port;
	__u8   proto;
	__u8   family;
	__u32  network;
	__u32  flags;       /* LACE_BACKEND_F_* */
};

#endif
