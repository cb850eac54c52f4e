"""Datapath tier: one throw-away namespace and pin root for the session, maps reset per test."""

import pytest

from .harness import Datapath


@pytest.fixture(scope="session")
def datapath():
    dp = Datapath()
    try:
        yield dp
    finally:
        dp.close()


@pytest.fixture
def dp(datapath):
    datapath.reset()
    return datapath
