"""The guard of tests/purity.py is on in this tier (tests/conftest.py applies it to tests/unit only)."""

from __future__ import annotations

import time

import pytest


def test_this_tier_refuses_to_sleep() -> None:
    with pytest.raises(AssertionError, match="a unit test slept: move it to tests/functional"):
        time.sleep(0)
