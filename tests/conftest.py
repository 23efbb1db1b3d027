"""Shared fixtures. Tests are fast and seeded; heavy sweeps are marked ``slow``."""

from __future__ import annotations

import pytest

from opdb import Store


@pytest.fixture
def store() -> Store:
    """An in-memory opdb."""
    return Store.memory()
