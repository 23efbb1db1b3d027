"""Imported once by the fork server that worker processes come from: the slow imports (torch,
the OpInfo database, the emulated device if installed) happen here, not in every worker."""

import warnings

import torch  # noqa: F401

from conformance.inputs.opinfo import infos

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    infos()
    try:
        import neuron_emu  # noqa: F401  (registers the device; workers choose their build)
    except Exception:  # noqa: BLE001 - a worker for another target does not need it
        pass
