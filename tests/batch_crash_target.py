"""A compiler target whose backend kills its process when it compiles a batch of samples
(conformance.batching), imported by a run through ``--import`` (tests/test_compile_batch.py): the
supervisor must blame no item and run the group on, unbatched."""

from __future__ import annotations

import os
import signal

from conformance.targets.base import register
from conformance.targets.inductor import CompilerTarget


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
