#!/usr/bin/env python3
"""The datapath fuzzer's long budget: hostile frames (tests/fuzz/harness.py) through the from-pod,
from-uplink and from-host programs for N minutes, each under a drawn policy world, every verdict checked (named,
no crash, no conntrack entry for a drop, the ``lace policy trace`` emulation agreeing where it
covers the frame).

Prints the examples run per program, the verdicts per drop reason, how the emulation compared,
disagreements, crashes and problems (recorded bugs by name, anything new by its text with the
numbers blanked: harness.problem_kind). Every input with a problem of a kind not seen before in
this run is saved to tests/fuzz/corpus/datapath (the CI replays that directory; recorded bugs,
tests.fuzz.harness.KNOWN_ISSUES, have theirs already); --no-save keeps the corpus as it is.
Exits 1 when a problem that is no recorded bug, or a crash, turned up.

Run as root after `make install`:  .venv/bin/python bench/fuzz.py --minutes 5 [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from lace.datapath.testbed import Testbed  # noqa: E402
from tests.fuzz import harness as fuzz  # noqa: E402  (test code: the repo root is on the path above)

#: examples per hypothesis run; each run starts from a fresh seed until the time is up
CHUNK = 250


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=1.0, help="how long to fuzz (default 1)")
    ap.add_argument("--programs", default=",".join(fuzz.PROGRAMS), help="comma-separated: " + ",".join(fuzz.PROGRAMS))
    ap.add_argument("--seed", type=int, default=None, help="first hypothesis seed (default: random)")
    ap.add_argument("--no-save", action="store_true", help="do not add failing inputs to the corpus")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args(argv)
    programs = [p for p in args.programs.split(",") if p]
    unknown = sorted(set(programs) - set(fuzz.PROGRAMS))
    if unknown:
        ap.error(f"unknown program(s) {', '.join(unknown)}; choose from {', '.join(fuzz.PROGRAMS)}")

    stats = fuzz.Stats()
    saved: list[str] = []
    seen: set[str] = set()
    rng = random.Random(args.seed)
    deadline = time.monotonic() + args.minutes * 60
    started = time.monotonic()
    with Testbed() as dp:
        harness = fuzz.Harness(dp)
        while time.monotonic() < deadline:
            for program in programs:
                run_chunk(dp, harness, program, rng.getrandbits(64), deadline, stats, seen, saved,
                          save=not args.no_save)
    elapsed = time.monotonic() - started
    doc = {
        "minutes": round(elapsed / 60, 2),
        "examples": dict(stats.examples),
        "examples_per_s": round(sum(stats.examples.values()) / elapsed, 1),
        "verdicts": {p: dict(c.most_common()) for p, c in stats.verdicts.items()},
        "emulation": dict(stats.emulation),
        "disagreements": stats.disagreements,
        "crashes": stats.crashes,
        "problems": dict(stats.problems.most_common()),
        "saved": saved,
    }
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        render(doc)
    new = [k for k in stats.problems if k.startswith("new: ")]
    return 1 if new or stats.crashes else 0


def run_chunk(dp: Testbed, harness: fuzz.Harness, program: str, chunk_seed: int, deadline: float,
              stats: fuzz.Stats, seen: set[str], saved: list[str], save: bool) -> None:
    """One hypothesis run of CHUNK examples for ``program``; examples past the deadline are skipped
    (hypothesis still draws them, cheaply)."""

    @seed(chunk_seed)
    @settings(max_examples=CHUNK, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(frame=fuzz.frames(dp, program), world=fuzz.worlds())
    def explore(frame: fuzz.Frame, world: fuzz.World) -> None:
        if time.monotonic() >= deadline:
            return
        out = harness.run(frame, world)
        stats.add(program, out)
        # a recorded bug has its cases in the corpus already: only what is new is kept, one case
        # per kind of problem as the statistics count them (not per text: texts carry values)
        kinds = {fuzz.problem_kind(p) for p in out.problems if fuzz.known_issue(p) is None}
        if save and kinds - seen:
            seen.update(kinds)
            saved.append(fuzz.save_case(frame, world, out))

    explore()


def render(doc: dict) -> None:
    total = sum(doc["examples"].values())
    print(f"{total} examples in {doc['minutes']} min ({doc['examples_per_s']}/s): "
          + ", ".join(f"{p} {n}" for p, n in doc["examples"].items()))
    for program, verdicts in doc["verdicts"].items():
        print(f"\n{program} verdicts")
        for verdict, n in verdicts.items():
            print(f"  {verdict:28} {n:7}")
    emu = doc["emulation"]
    print("\nemulation (lace policy trace's engine) on the frames it covers: "
          + ", ".join(f"{k} {emu.get(k, 0)}" for k in ("agrees", "beyond", "disagrees"))
          + f"; not covered {emu.get('not covered', 0)}")
    print(f"disagreements {doc['disagreements']}, crashes {doc['crashes']}")
    if doc["problems"]:
        print("\nproblems (known issues by name, see tests.fuzz.harness.KNOWN_ISSUES)")
        for kind, n in doc["problems"].items():
            print(f"  {n:7}  {kind}")
    for path in doc["saved"]:
        print(f"saved {path}")


if __name__ == "__main__":
    sys.exit(main())
