"""Test-wide rules: privileged tiers must run where they can (root, CI) — a skip there fails."""

from __future__ import annotations

import os

import pytest


def _must_run_privileged() -> bool:
    return os.geteuid() == 0 or os.environ.get("CI") == "true"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # an expected failure is reported as skipped too (with wasxfail): that one ran, it is no skip
    if (report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker("privileged")
            and _must_run_privileged()):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"privileged test skipped where it must run (root/CI): {reason}"


def pytest_collection_modifyitems(config, items):
    # tests under tests/{datapath,integration,e2e} are privileged by tier
    for item in items:
        parts = item.path.parts
        if any(tier in parts for tier in ("datapath", "integration", "e2e")):
            item.add_marker(pytest.mark.privileged)
