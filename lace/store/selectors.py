"""Kubernetes label selectors: matching, validation and the ``-l`` string syntax.

``matches`` implements metav1.LabelSelector semantics exactly: every matchLabels pair and every
matchExpressions requirement must hold; an empty selector ``{}`` selects everything, ``None``
selects nothing (as a nil selector does in NetworkPolicy peers). The policy engine reuses this.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")

_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class InvalidSelector(ValueError):
    """A selector (dict or string) that cannot be evaluated; ``field`` locates it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label key ([prefix/]name), or None."""
    if not isinstance(key, str) or not key:
        return "a label key must be a non-empty string"
    prefix, _, name = key.rpartition("/")
    if "/" in key and not prefix:
        return f'label key "{key}" has an empty prefix before "/"'
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f'label key prefix "{prefix}" must be a lowercase DNS subdomain (e.g. example.com)'
    if len(name) > 63 or not _NAME.match(name):
        return (f'label key "{key}" must be at most 63 characters of letters, digits, "-", "_" or "."'
                " starting and ending with a letter or digit")
    return None


def label_value_problem(value: Any) -> str | None:
    """Why ``value`` is not a valid label value, or None (the empty string is valid)."""
    if not isinstance(value, str):
        return f"label value {value!r} must be a string (quote it in YAML)"
    if value and (len(value) > 63 or not _NAME.match(value)):
        return (f'label value "{value}" must be at most 63 characters of letters, digits, "-", "_"'
                ' or ".", starting and ending with a letter or digit')
    return None


def validate_selector(selector: Any, field: str = "selector") -> None:
    """Raise InvalidSelector when ``selector`` is not a well-formed LabelSelector."""
    if selector is None:
        return
    if not isinstance(selector, Mapping):
        raise InvalidSelector(field, "a label selector must be an object with matchLabels/matchExpressions")
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise InvalidSelector(f"{field}.{sorted(unknown)[0]}",
                              "unknown selector field; use matchLabels or matchExpressions")
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping):
        raise InvalidSelector(f"{field}.matchLabels", "must be a map of label key to value")
    for key, value in match_labels.items():
        problem = label_key_problem(key) or label_value_problem(value)
        if problem:
            raise InvalidSelector(f"{field}.matchLabels.{key}", problem)
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise InvalidSelector(f"{field}.matchExpressions", "must be a list of {key, operator, values}")
    for i, expr in enumerate(expressions):
        where = f"{field}.matchExpressions[{i}]"
        if not isinstance(expr, Mapping):
            raise InvalidSelector(where, "must be an object with key, operator and values")
        problem = label_key_problem(expr.get("key"))
        if problem:
            raise InvalidSelector(f"{where}.key", problem)
        op = expr.get("operator")
        if op not in OPERATORS:
            raise InvalidSelector(f"{where}.operator",
                                  f"unknown operator {op!r}; use one of {', '.join(OPERATORS)}")
        values = expr.get("values")
        if op in ("In", "NotIn"):
            if not values or not isinstance(values, list):
                raise InvalidSelector(f"{where}.values", f"operator {op} needs a non-empty list of values")
            for j, value in enumerate(values):
                problem = label_value_problem(value)
                if problem:
                    raise InvalidSelector(f"{where}.values[{j}]", problem)
        elif values:
            raise InvalidSelector(f"{where}.values", f"operator {op} takes no values; remove them")


def _requirement_holds(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op = expr["key"], expr["operator"]
    values = expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise InvalidSelector("operator", f"unknown operator {op!r}")


def matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """True when ``labels`` satisfy ``selector`` (None selects nothing, {} selects everything)."""
    if selector is None:
        return False
    labels = labels or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    return all(_requirement_holds(e, labels) for e in selector.get("matchExpressions") or [])


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise InvalidSelector("", f'unbalanced ")" in selector "{text}"')
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise InvalidSelector("", f'unbalanced "(" in selector "{text}"')
    parts.append("".join(current))
    return parts


_SET_RE = re.compile(r"^(?P<key>[^\s=!()]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQ_RE = re.compile(r"^(?P<key>[^\s=!()]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s=!(),]*)$")


def parse_selector_string(text: str) -> dict[str, Any]:
    """Parse kubectl's ``-l`` syntax into a LabelSelector dict.

    ``a=b,c!=d,e in (x,y),f notin (z),g,!h`` → matchLabels {a: b} and expressions
    c NotIn [d], e In [x, y], f NotIn [z], g Exists, h DoesNotExist.
    """
    selector: dict[str, Any] = {"matchLabels": {}, "matchExpressions": []}
    if not text.strip():
        return {}
    for raw in _split_top_level(text):
        part = raw.strip()
        if not part:
            raise InvalidSelector("", f'empty requirement in selector "{text}"')
        if m := _SET_RE.match(part):
            values = [v.strip() for v in m["values"].split(",") if v.strip()]
            op = "In" if m["op"] == "in" else "NotIn"
            selector["matchExpressions"].append({"key": m["key"], "operator": op, "values": values})
        elif m := _EQ_RE.match(part):
            if m["op"] == "!=":
                selector["matchExpressions"].append(
                    {"key": m["key"], "operator": "NotIn", "values": [m["value"]]})
            else:
                selector["matchLabels"][m["key"]] = m["value"]
        elif part.startswith("!") and _NAME_OR_PREFIXED.match(part[1:].strip()):
            selector["matchExpressions"].append({"key": part[1:].strip(), "operator": "DoesNotExist"})
        elif _NAME_OR_PREFIXED.match(part):
            selector["matchExpressions"].append({"key": part, "operator": "Exists"})
        else:
            raise InvalidSelector("", f'cannot parse "{part}" in selector "{text}"; use forms like '
                                      'a=b, a!=b, a in (x,y), a notin (x), a, !a')
    if not selector["matchExpressions"]:
        del selector["matchExpressions"]
    if not selector["matchLabels"]:
        del selector["matchLabels"]
    _validate_parsed(selector, text)
    return selector


_NAME_OR_PREFIXED = re.compile(r"^[^\s=!(),]+$")


def _validate_parsed(selector: dict[str, Any], text: str) -> None:
    # empty values are legal in "a=" but an In list needs at least one
    try:
        validate_selector(selector, "")
    except InvalidSelector as err:
        raise InvalidSelector("", f'selector "{text}": {err.problem}') from None


def format_selector(selector: Mapping[str, Any] | None) -> str:
    """Render a LabelSelector back into the ``-l`` string syntax (``<none>`` for None/empty)."""
    if not selector:
        return "<none>"
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for e in selector.get("matchExpressions") or []:
        op, key, values = e["operator"], e["key"], e.get("values") or []
        if op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            parts.append(f"{key} {op.lower()} ({','.join(values)})")
    return ",".join(parts) or "<none>"
