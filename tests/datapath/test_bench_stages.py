"""bench/datapath.py's stage table loads pod_veth.c cut at each stage point (``make bpf`` builds
them with -DLACE_BENCH_STOP=n): every cut object must pass the verifier. (One cut once stopped the
non-ICMP paths only, leaving the ICMP error path to be verified alone, unpruned, past the
verifier's million instructions; the bench then died before its stage table.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench():
    path = Path(__file__).resolve().parents[2] / "bench" / "datapath.py"
    spec = importlib.util.spec_from_file_location("bench_datapath_stages", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules[spec.name]


def test_every_stage_cut_of_the_pod_program_loads(bench, datapath):
    progs = bench.load_stage_programs(datapath)
    try:
        cuts = sorted({cut for stages in bench.STAGES.values() for cut, _ in stages if cut is not None})
        assert sorted(progs) == cuts and cuts, f"loaded cuts {sorted(progs)}, the stage table asks for {cuts}"
    finally:
        for obj, _ in progs.values():
            obj.close()
