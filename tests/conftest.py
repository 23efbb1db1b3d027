"""Shared fixtures. Tests are fast and seeded; heavy sweeps are marked ``slow``."""

from __future__ import annotations

import pytest

from opdb import Store


@pytest.fixture
def store() -> Store:
    """An in-memory opdb."""
    return Store.memory()


def pytest_configure(config: pytest.Config) -> None:
    # The emulated device must be registered before the first autograd backward of the
    # process: the engine sizes its device threads once (see neuron_emu's notes).
    import neuron_emu  # noqa: F401
