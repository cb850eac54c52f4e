"""Datapath tier: one throw-away namespace and pin root for the session, maps reset per test."""

import pytest

from lace.datapath.testbed import Testbed


@pytest.fixture(scope="session")
def datapath():
    dp = Testbed()
    try:
        yield dp
    finally:
        dp.close()


@pytest.fixture
def dp(datapath):
    datapath.reset()
    return datapath
