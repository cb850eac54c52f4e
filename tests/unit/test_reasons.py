"""The drop-reason and trace-point tables tell the truth: a reserved entry is emitted by no
datapath program, and every live one is emitted somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lace.datapath.reasons import DropReason, TracePoint

ROOT = Path(__file__).resolve().parents[2]
SOURCES = "\n".join(p.read_text() for d in ("bpf/lib", "bpf/progs") for p in sorted((ROOT / d).rglob("*.[ch]")))


def _used(prefix: str, name: str) -> bool:
    return re.search(rf"\b{prefix}{name}\b", SOURCES) is not None


@pytest.mark.parametrize("reason", [r for r in DropReason if r is not DropReason.NONE], ids=lambda r: r.label)
def test_drop_reason_reserved_iff_not_emitted(reason):
    assert _used("LACE_DROP_", reason.name) != reason.reserved, (
        f"{reason.name}: {'reserved but emitted' if reason.reserved else 'live but emitted nowhere'} "
        "(fix bpf/include/lace/abi/drop_reasons.def)")


@pytest.mark.parametrize("point", [p for p in TracePoint if p is not TracePoint.UNSPEC], ids=lambda p: p.label)
def test_trace_point_reserved_iff_not_observed(point):
    assert _used("LACE_POINT_", point.name) != point.reserved
