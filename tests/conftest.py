"""Shared fixtures. Tests are fast and seeded; heavy sweeps are marked ``slow``."""

from __future__ import annotations

import os
import warnings

import pytest

# The suite runs the emulator as the harness does: a failed device execution raises instead of
# being silently recovered on the CPU (the real device's default, and the emulator's; the
# neuron-emu target sets this in every process it runs in). Tests of recovery unset it.
os.environ["NEURON_EMU_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS"] = "1"

import neuron_emu  # noqa: E402  (registers the device before any autograd backward, see pytest_configure)
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


_START_BUILD = neuron_emu.active_build()  # the build this test session started on


@pytest.fixture(autouse=True)
def _emulator_build_restored():
    """Each test ends with the emulator on the build the session started with: a test, or a
    module fixture, that switched builds (a target on a manifest in a tmp folder) must not decide
    which build a later test of its worker runs. Targets switch to their own build before they run
    anything, so a module fixture's target still runs its build in the next test."""
    yield
    if neuron_emu.active_build() is not _START_BUILD:
        neuron_emu.use_build(_START_BUILD)


@pytest.fixture
def store() -> Store:
    """An in-memory opdb."""
    return Store.memory()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--dist loadgroup`` sends the tests of one ``xdist_group`` to one worker by the ``@group``
    suffix pytest-xdist (3.8) appends to their node ids, which it writes to ``item._nodeid``:
    pytest 9 keeps the id in ``item._id``, so no test had a group. The same suffix, where pytest 9
    reads it (nothing to do where xdist's own suffix took)."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):
            from _pytest.nodeid import NodeId  # pytest 9's

            item._id = NodeId.parse(item.nodeid + suffix)


def pytest_configure(config: pytest.Config) -> None:
    # The emulated device must be registered before the first autograd backward of the
    # process: the engine sizes its device threads once (see neuron_emu's notes).
    import neuron_emu  # noqa: F401
