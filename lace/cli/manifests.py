"""Reading manifests for ``apply -f``/``delete -f``: files, directories or stdin; YAML or JSON;
multi-document streams and ``List`` kinds, each object remembering where it came from."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TextIO

import yaml

from lace.cli.errors import InvalidInputError, NotFoundError

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


@dataclasses.dataclass(frozen=True)
class Manifest:
    """One object from a manifest and where it came from (for error messages)."""

    source: str
    obj: Any


def _read(path: str, stdin: TextIO) -> list[tuple[str, str]]:
    if path == "-":
        return [("<stdin>", stdin.read())]
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in MANIFEST_SUFFIXES and f.is_file())
        if not files:
            raise NotFoundError(f"{path}: the directory has no .yaml, .yml or .json files")
        return [(str(f), f.read_text()) for f in files]
    try:
        return [(path, p.read_text())]
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such file", hint="check the path passed to -f") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidInputError(f"{path}: cannot read: {err}") from None


def _parse(source: str, text: str) -> list[Any]:
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InvalidInputError(f"{source}:{where} cannot parse YAML/JSON: {problem}",
                                hint="nothing was written") from None


def load_manifests(paths: list[str], stdin: TextIO) -> list[Manifest]:
    """Every object in ``paths`` in order; ``List`` documents are expanded into their items."""
    out: list[Manifest] = []
    for path in paths:
        for source, text in _read(path, stdin):
            docs = _parse(source, text)
            for i, doc in enumerate(docs):
                where = f"{source} (document {i + 1})" if len(docs) > 1 else source
                if not isinstance(doc, dict):
                    raise InvalidInputError(f"{where}: expected an object (a mapping), got "
                                            f"{type(doc).__name__}", hint="nothing was written")
                kind = doc.get("kind")
                if isinstance(kind, str) and kind.endswith("List") and "items" in doc:
                    items = doc.get("items") or []
                    if not isinstance(items, list):
                        raise InvalidInputError(f"{where}: items of a {kind} must be a list")
                    out.extend(Manifest(f"{where} item {j + 1}", item) for j, item in enumerate(items))
                else:
                    out.append(Manifest(where, doc))
    if not out:
        raise InvalidInputError(f"no objects found in {', '.join(paths)}")
    return out
