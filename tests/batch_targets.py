"""Compiler targets for runs through the workers, registered by ``--import batch_targets``
(tests/test_compile_batch.py): ``aot_eager`` as it is, and one whose backend kills its process
when it compiles a batch of samples (conformance.check.batching): the supervisor must blame no item
and run the group on, unbatched."""

from __future__ import annotations

import os
import signal

from conformance.targets.base import register
from conformance.targets.inductor import CompilerTarget


@register
class WorkerAotEager(CompilerTarget):
    name = "test-worker-aot-eager"
    backend_name = "aot_eager"


@register
class BatchCrash(CompilerTarget):
    name = "test-batch-crash"
    backend_name = "aot_eager"

    def wrap(self, fn):
        self.batch = getattr(fn, "__name__", "").startswith("batch_of_")
        return super().wrap(fn)

    def compile_graph(self, gm, example_inputs, record):
        if self.batch:
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().compile_graph(gm, example_inputs, record)
