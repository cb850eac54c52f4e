"""Small files the lab keeps (lab.json, procs.json, sandbox records), written atomically."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, prefix: str | None = None, suffix: str = ".tmp") -> Iterator[str]:
    """A new empty file (mode 0600) next to ``path`` for the block to fill, moved over ``path`` when
    the block ends, so that readers see the old file or the new, never half; removed if it raises.
    ``prefix`` defaults to ``.NAME.``."""
    path = os.fspath(path)
    if prefix is None:
        prefix = f".{os.path.basename(path)}."
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=prefix, suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as JSON to ``path`` so that readers see the old file or the new, never half."""
    with replacing(path) as tmp, open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
