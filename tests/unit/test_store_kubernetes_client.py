"""What the Kubernetes store's client module does without an apiserver: Lease times."""

from __future__ import annotations

import datetime

import pytest

from lace.store.kubernetes_client import format_micro_time, parse_micro_time

UTC = datetime.UTC


@pytest.mark.parametrize("text, expected", [
    ("2024-05-01T10:20:30.123456Z", datetime.datetime(2024, 5, 1, 10, 20, 30, 123456, tzinfo=UTC)),
    ("2024-05-01T10:20:30Z", datetime.datetime(2024, 5, 1, 10, 20, 30, tzinfo=UTC)),   # a Time, not a MicroTime
    ("2024-05-01T12:20:30.5+02:00", datetime.datetime(2024, 5, 1, 10, 20, 30, 500000, tzinfo=UTC)),
    ("", None), (None, None), ("yesterday", None),
])
def test_lease_times_parse_as_any_writer_sends_them(text, expected) -> None:
    assert parse_micro_time(text) == expected


def test_lease_times_format_as_micro_time_and_read_back() -> None:
    t = datetime.datetime(2024, 5, 1, 10, 20, 30, 7, tzinfo=UTC)
    assert format_micro_time(t) == "2024-05-01T10:20:30.000007Z"
    assert parse_micro_time(format_micro_time(t)) == t
    now = parse_micro_time(format_micro_time())
    assert now is not None and abs((datetime.datetime.now(UTC) - now).total_seconds()) < 5
