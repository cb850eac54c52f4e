/* enum lace_drop_reason and enum lace_trace_point, expanded from their .def tables. */
#ifndef LACE_ABI_REASONS_H
#define LACE_ABI_REASONS_H

enum lace_drop_reason {
#define LACE_DROP(name, code, text) LACE_DROP_##name = code,
#define LACE_DROP_RESERVED(name, code, text) LACE_DROP(name, code, text)
#include "lace/abi/drop_reasons.def"
#undef LACE_DROP_RESERVED
#undef LACE_DROP
};

enum lace_trace_point {
#define LACE_TRACE_POINT(name, code, label, text) LACE_POINT_##name = code,
#define LACE_TRACE_POINT_RESERVED(name, code, label, text) LACE_TRACE_POINT(name, code, label, text)
#include "lace/abi/trace_points.def"
#undef LACE_TRACE_POINT_RESERVED
#undef LACE_TRACE_POINT
};

#endif
