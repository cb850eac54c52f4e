"""bench/services.py measures what it says: every plane it compares translates the measured VIP
to all three backends with filler services programmed, lace among them. (A lace plane that wrote
its maps without the revnat entries once printed "n/a" for every lace cell: the replies of its
one-entry service flows found no frontend.)"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench():
    path = Path(__file__).resolve().parents[2] / "bench" / "services.py"
    spec = importlib.util.spec_from_file_location("bench_services", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # its dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules[spec.name]


PLANES = ["lace", "lace@0", "iptables-nft", "iptables-legacy", "nftables", "direct"]


def test_every_plane_answers_through_its_translation(bench):
    tag = f"t{os.getpid()}-{uuid.uuid4().hex[:4]}"
    workdir = tempfile.mkdtemp(prefix="lace-test-bench-services-")
    skipped: dict[str, str] = {}
    planes, server = [], None
    try:
        crr = bench.compile_crr(workdir)
        planes = bench.build(PLANES, tag, skipped)
        assert not skipped, f"planes that cannot run: {skipped}"
        server = bench.Server(crr, [p.topo for p in planes])
        services = bench.make_services(200)
        for plane in planes:
            if isinstance(plane, bench.Lace):
                plane.attach()
            plane.program(services, True)
        problems = {p.name: why for p in planes if (why := bench.probe(crr, p))}
        assert not problems, f"planes whose connections were not answered: {problems}"
    finally:
        if server is not None:
            server.close()
        for p in planes:
            p.close()
        for p in planes:
            p.topo.close()
        shutil.rmtree(workdir, ignore_errors=True)
