"""Shared fixtures. Tests are fast and seeded; heavy sweeps are marked ``slow``."""

from __future__ import annotations

import warnings

import pytest

import neuron_emu  # registers the device before any autograd backward (see pytest_configure)
from opdb import Store


@pytest.fixture(params=["ideal", *neuron_emu.shipped_builds()])
def emu_build(request):
    """Each emulator build in turn (the `ideal` control first) active for one test."""
    prev = neuron_emu.active_build()
    neuron_emu.use_build(request.param)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # once-per-op fallback warnings
        yield request.param
    neuron_emu.use_build(prev)


@pytest.fixture(autouse=True)
def _emulator_build_restored():
    """The emulator's active build as each test found it: a test that switches builds (a target
    on a manifest in tmp_path) must not decide which build a later test of its worker runs."""
    prev = neuron_emu.active_build()
    yield
    if neuron_emu.active_build() is not prev:
        neuron_emu.use_build(prev)


@pytest.fixture
def store() -> Store:
    """An in-memory opdb."""
    return Store.memory()


def pytest_configure(config: pytest.Config) -> None:
    # The emulated device must be registered before the first autograd backward of the
    # process: the engine sizes its device threads once (see neuron_emu's notes).
    import neuron_emu  # noqa: F401
