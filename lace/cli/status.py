"""The one exit-status enum of every lace command."""

from __future__ import annotations

import contextlib
import enum
import sys
from typing import NoReturn


class ExitStatus(enum.IntEnum):
    """What a lace command's exit code means; scripts may rely on these numbers."""

    OK = 0
    ERROR = 1          # anything not covered below, including unexpected failures
    USAGE = 2          # bad command line (argparse's own convention)
    NOT_FOUND = 3      # the named object, kind, file or lab does not exist
    CONFLICT = 4       # stale resourceVersion, name already taken
    UNAVAILABLE = 5    # no lab running, store unreachable or locked, agent down
    INVALID = 6        # input rejected by validation; nothing was written
    FORBIDDEN = 7      # refused by a rule (deleting the default network, a network in use)
    INTERRUPTED = 130  # Ctrl-C


def exit_with(status: ExitStatus) -> NoReturn:
    """End a console script: flush stdout (a reader that went away is not an error), exit ``status``."""
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
    sys.exit(int(status))
