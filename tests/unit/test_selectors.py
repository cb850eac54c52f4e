"""Label selectors: LabelSelector matching semantics, validation, and the -l string syntax."""

from __future__ import annotations

import pytest

from lace.store.selectors import (InvalidSelector, format_selector, matches, parse_selector_string,
                                  validate_selector)

LABELS = {"app": "web", "tier": "front", "env": "prod"}


@pytest.mark.parametrize("selector, labels, expected", [
    (None, LABELS, False),
    ({}, LABELS, True),
    ({}, {}, True),
    ({"matchLabels": {"app": "web"}}, LABELS, True),
    ({"matchLabels": {"app": "db"}}, LABELS, False),
    ({"matchLabels": {"app": "web", "tier": "back"}}, LABELS, False),
    ({"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "qa"]}]}, LABELS, True),
    ({"matchExpressions": [{"key": "env", "operator": "In", "values": ["qa"]}]}, LABELS, False),
    ({"matchExpressions": [{"key": "missing", "operator": "In", "values": ["x"]}]}, LABELS, False),
    ({"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["qa"]}]}, LABELS, True),
    ({"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["prod"]}]}, LABELS, False),
    ({"matchExpressions": [{"key": "missing", "operator": "NotIn", "values": ["x"]}]}, LABELS, True),
    ({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, LABELS, True),
    ({"matchExpressions": [{"key": "missing", "operator": "Exists"}]}, LABELS, False),
    ({"matchExpressions": [{"key": "missing", "operator": "DoesNotExist"}]}, LABELS, True),
    ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, LABELS, False),
    ({"matchLabels": {"app": "web"},
      "matchExpressions": [{"key": "tier", "operator": "In", "values": ["back"]}]}, LABELS, False),
    ({"matchLabels": {"app": "web"}}, None, False),
])
def test_matches(selector, labels, expected):
    assert matches(selector, labels) is expected


@pytest.mark.parametrize("text, expected", [
    ("", {}),
    ("a=b", {"matchLabels": {"a": "b"}}),
    ("a==b", {"matchLabels": {"a": "b"}}),
    ("a=b,c!=d", {"matchLabels": {"a": "b"},
                  "matchExpressions": [{"key": "c", "operator": "NotIn", "values": ["d"]}]}),
    ("e in (x,y)", {"matchExpressions": [{"key": "e", "operator": "In", "values": ["x", "y"]}]}),
    ("e in (x, y), f notin (z)", {"matchExpressions": [
        {"key": "e", "operator": "In", "values": ["x", "y"]},
        {"key": "f", "operator": "NotIn", "values": ["z"]}]}),
    ("g,!h", {"matchExpressions": [{"key": "g", "operator": "Exists"},
                                   {"key": "h", "operator": "DoesNotExist"}]}),
    ("app.kubernetes.io/name=web", {"matchLabels": {"app.kubernetes.io/name": "web"}}),
    ("a=", {"matchLabels": {"a": ""}}),
])
def test_parse_selector_string(text, expected):
    assert parse_selector_string(text) == expected


def test_parsed_string_matches_like_kubectl():
    sel = parse_selector_string("a=b,c!=d,e in (x,y),!f")
    assert matches(sel, {"a": "b", "e": "x"})
    assert matches(sel, {"a": "b", "c": "z", "e": "y"})
    assert not matches(sel, {"a": "b", "c": "d", "e": "x"})
    assert not matches(sel, {"a": "b", "e": "x", "f": "1"})
    assert not matches(sel, {"a": "b"})


@pytest.mark.parametrize("text", ["a in (x", "a in x)", "a=b,,c", "a in ()", "=b", "a b", "-a=b"])
def test_parse_selector_string_rejects(text):
    with pytest.raises(InvalidSelector):
        parse_selector_string(text)


@pytest.mark.parametrize("selector, field", [
    ({"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["x"]}]},
     "s.matchExpressions[0].operator"),
    ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "s.matchExpressions[0].values"),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": []}]}, "s.matchExpressions[0].values"),
    ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
     "s.matchExpressions[0].values"),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist", "values": ["x"]}]},
     "s.matchExpressions[0].values"),
    ({"matchLabels": {"bad key!": "x"}}, "s.matchLabels.bad key!"),
    ({"matchLabels": {"a": "bad value!"}}, "s.matchLabels.a"),
    ({"matchLabel": {"a": "b"}}, "s.matchLabel"),
])
def test_validate_selector_rejects(selector, field):
    with pytest.raises(InvalidSelector) as info:
        validate_selector(selector, "s")
    assert info.value.field == field


def test_format_selector_round_trips():
    text = "a=b,c notin (d),e in (x,y),g,!h"
    assert parse_selector_string(format_selector(parse_selector_string(text))) == parse_selector_string(text)
    assert format_selector(None) == "<none>"
