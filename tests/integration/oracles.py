"""Independent oracles for the privileged tiers: iproute2's own view (`ip -j`) and iputils ping
(both installed by `make install`), never lace's code under test."""

from __future__ import annotations

import json
import subprocess


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def ipj(ns: str, *args: str) -> list[dict]:
    return json.loads(ip("-j", "-n", ns, *args).stdout or "[]")


def ping(ns: str, addr: str) -> None:
    """One echo request from namespace ``ns`` to ``addr`` must be answered (raises otherwise)."""
    ip("netns", "exec", ns, "ping", "-c1", "-W1", addr)
