"""Imported once by the fork server that worker processes come from: the slow imports (torch,
the OpInfo database, the run's target's device package) happen here, not in every worker.

First, the fork server ties itself to the supervisor that started it (see
:mod:`conformance.run.isolation`): killed with -9, the supervisor takes the fork server with it,
and each worker dies with the fork server and the supervisor."""

import os

from conformance.run.isolation import PDEATHSIG_ENV, PRELOAD_ENV, SUPERVISOR_ENV, die_with

FORKSERVER_PID: int | None = None  # the fork server's pid, as its forked workers see it

# Armed only when our parent is the process that asked for it: a variable inherited from some
# ancestor (a test that ran a sweep, then started a subprocess) names another process.
if os.environ.get(SUPERVISOR_ENV, "").isdigit() and int(os.environ[SUPERVISOR_ENV]) == os.getppid():
    FORKSERVER_PID = os.getpid()
    die_with(os.getppid(), os.getppid(), pdeathsig=os.environ.get(PDEATHSIG_ENV) == "1")

import warnings  # noqa: E402

import torch  # noqa: E402,F401

from conformance.inputs.opinfo import infos  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    infos()
    from conformance.targets import preload

    preload(os.environ.get(PRELOAD_ENV))

# What every worker's first item paid again, inside its timeout (1-3 s on a loaded machine):
# the overload catalog (conformance.check.comparators asks it which OpInfos are random; it
# depends on the registry's tags and CPU kernels only, not on a target or build), and the
# module-file cache of inspect (OpInfo.error_inputs calls inspect.stack()).
import inspect  # noqa: E402

from conformance.catalog.overloads import overloads  # noqa: E402

overloads()
inspect.stack()
