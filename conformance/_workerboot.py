"""Imported once by the fork server that worker processes come from: the slow imports (torch,
the OpInfo database, the emulated device if installed) happen here, not in every worker.

The fork server also ties itself to the supervisor that started it (see
:mod:`conformance.isolation`): killed with -9, the supervisor takes the fork server with it,
and each worker dies with the fork server and the supervisor."""

import os
import warnings

import torch  # noqa: F401

from conformance.inputs.opinfo import infos
from conformance.isolation import PDEATHSIG_ENV, SUPERVISOR_ENV, die_with

FORKSERVER_PID: int | None = None  # the fork server's pid, as its forked workers see it

# Only the fork server imports this module (as its preload); its parent is the supervisor.
if os.environ.get(SUPERVISOR_ENV, "").isdigit() and int(os.environ[SUPERVISOR_ENV]) != os.getpid():
    FORKSERVER_PID = os.getpid()
    _supervisor = int(os.environ[SUPERVISOR_ENV])
    die_with(_supervisor, _supervisor, pdeathsig=os.environ.get(PDEATHSIG_ENV) == "1")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    infos()
    try:
        import neuron_emu  # noqa: F401  (registers the device; workers choose their build)
    except Exception:  # noqa: BLE001 - a worker for another target does not need it
        pass
