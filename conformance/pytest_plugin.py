"""pytest plugin: every op x dtype x variant x sample becomes a pytest item.

Only options, hooks and fixtures live here; the sweep code is imported when the plugin is used
(``pytest --conformance-target neuron-emu``).
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "operator conformance sweep")
    group.addoption("--conformance-target", default=None, metavar="TARGET",
                    help="Collect the op sweep for TARGET as pytest items (e.g. neuron-emu).")
    group.addoption("--conformance-build", default=None, metavar="BUILD",
                    help="SDK build name or manifest path for the target.")
    group.addoption("--conformance-ops", action="append", default=[], metavar="GLOB",
                    help="OpInfo name globs to collect (repeatable; default all).")
    group.addoption("--conformance-dtypes", default=None, metavar="LIST",
                    help="Comma-separated dtypes (default: the sweep's default set).")
    group.addoption("--conformance-db", default=None, metavar="PATH",
                    help="opdb file the results are written to.")
