"""bench/datapath.py's measured flows keep their source ports apart: the sizes it runs pass its
check, and more calls than the port plan holds fail it instead of timing established flows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench():
    path = Path(__file__).resolve().parents[2] / "bench" / "datapath.py"
    spec = importlib.util.spec_from_file_location("bench_datapath", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("calls,rounds", [(300, 3), (1500, 5)], ids=["quick", "full"])
def test_the_runs_it_makes_fit(bench, calls, rounds):
    bench.check_port_ranges(calls, rounds)


@pytest.mark.parametrize("calls,rounds,where", [
    (2000, 5, "new flows reach port"),            # the main table into the stage table's ports
    (4100, 1, "warm rows' flows reach port"),     # the warm rows past the fixed flows
], ids=["main", "warm"])
def test_more_calls_than_ports_fail(bench, calls, rounds, where):
    with pytest.raises(AssertionError, match=where):
        bench.check_port_ranges(calls, rounds)
