"""The lab's controllers process (``python -m lace.controllers``): one per lab, on the lab's store.

``lace lab up`` starts it after the kubelet, ``lace lab restart-controllers`` restarts it (it
resyncs from the store and rewrites nothing that is already right) and ``lace lab down`` stops it
with every other lab process. It runs in the machine's own namespace: it only talks to the store.
"""

from __future__ import annotations

import os
import sys

from lace.store.config import lab_store

from . import procs

PROC_NAME = "controllers"


def start(state_dir: str) -> int:
    """Start the lab's controllers; returns the pid."""
    argv = [sys.executable, "-m", "lace.controllers", "--store", str(lab_store(state_dir))]
    return procs.spawn(argv, netns=None, name=PROC_NAME, state_dir=state_dir,
                       log_path=os.path.join(state_dir, "logs", f"{PROC_NAME}.log"))


def restart(state_dir: str) -> int:
    """Stop the lab's controllers (if they run) and start them again; returns the new pid."""
    procs.stop(PROC_NAME, state_dir, timeout=5)
    return start(state_dir)


def pid(state_dir: str) -> int | None:
    """The running controllers' pid, or None."""
    p = next((p for p in procs.list_procs(state_dir) if p.name == PROC_NAME), None)
    return p.pid if p is not None and p.alive else None
