"""``openvino``: ``torch.compile(backend="openvino")`` (after ``import openvino.torch``) on the
CPU against eager CPU, on the :class:`~conformance.targets.inductor.CompilerTarget` base (a
fresh dynamo per item, a counting backend, no compiled call under a dispatch mode).

OpenVINO's backend hands work back to PyTorch in four ways, three of them silent, and each item
says which happened:

- it partitions every graph: the ops its frontend supports run in OpenVINO subgraphs, the rest
  run as PyTorch kernels. Those are the item's ``fallback_kernels`` and its fallback ops
  (``pass_fallback`` when the values pass); ``openvino_subgraphs`` (and the generic
  ``backend_ran``) counts the subgraphs OpenVINO compiled and ran. An item with none ran wholly in
  PyTorch: still ``pass_fallback`` when its values pass, and counted apart on the report.
- by default it makes no subgraph of a single op (a lone op between unsupported ones stays in
  PyTorch), so a one-op sample would never reach OpenVINO; the target passes the option
  ``testing`` that allows single-op subgraphs (OpenVINO's own layer tests do the same).
- a graph it fails to convert it compiles with inductor instead (``compile_fx``): here that is
  an ``error`` with OpenVINO's reason, never an inductor result passed off as OpenVINO's.
- a subgraph that fails to compile or run in OpenVINO it runs in PyTorch from then on: its ops
  are fallback kernels too, and ``openvino_failed`` holds the reason it logged (only there).

Gradients (the ``backward`` variant) go through its ``aot_autograd`` option, forward and
backward graphs both compiled by OpenVINO.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .base import Compiled, Dispatched, OpTrace, TargetError, overload_name, register
from .inductor import CompilerTarget

INSTALL = "pip install -e '.[backends]' -c constraints.txt"
OPTIONS = {"device": "CPU", "testing": True}  # testing: single-op subgraphs allowed (see above)
_EXECUTE_LOG = "openvino.frontend.pytorch.torchdynamo.execute"
# What a standalone repro script runs first (torch and openvino only): the graph OpenVINO fails to
# convert raises there too, as in the sweep, instead of being compiled by inductor and passing; and
# the backend is called with the options the sweep's compile_graph gives (aot_autograd with gradients).
REPRO_SETUP = """import sys

import openvino.torch  # noqa: F401  (registers the "openvino" torch.compile backend)
from openvino.frontend.pytorch.torchdynamo import backend as _openvino_backend


def _no_inductor(*_, **__):
    exc = sys.exc_info()[1]  # OpenVINO calls its inductor fallback from the handler of its own failure
    raise RuntimeError(f"OpenVINO failed to convert the graph (its backend would compile it with inductor "
                       f"instead): {type(exc).__name__}: {exc}")


_openvino_backend.compile_fx = _no_inductor


def _openvino(gm, example_inputs):
    # the options compile_graph gives: with gradients, forward and backward through aot_autograd
    options = dict(OPTIONS)
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        options["aot_autograd"] = True
    return _openvino_backend.openvino(gm, example_inputs, options=options)"""


class _Log(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _execution_log() -> Iterator[_Log]:
    """What OpenVINO's executor logs at debug level while the block runs (why a subgraph fell
    back to PyTorch is said only there), kept from every other handler."""
    logger = logging.getLogger(_EXECUTE_LOG)
    handler = _Log()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


@register
class OpenVinoTarget(CompilerTarget):
    name = "openvino"
    description = "torch.compile(backend='openvino') on OpenVINO's CPU device vs eager CPU"
    backend_name = "openvino"
    # Batched (conformance.check.batching), but OpenVINO hands work to PyTorch per partition of a
    # graph: a batch in which any op ran in PyTorch (a fallback kernel, a subgraph that failed)
    # cannot tell whose sample it was, so it is not kept (batch_problem) and bisection finds the
    # samples that fall back; they run alone and report their own fallback. Not by default: its
    # compiles are cheap next to an item's other work, and batches of 16 measured 1.14x as fast on
    # function variants and 0.89x on all four (the out= variant always leaves its copy to PyTorch,
    # so every out= batch is bisected in vain); --compile-batch N turns them on.
    batchable = True
    default_batch = 1

    def setup(self) -> None:
        try:
            import openvino
            import openvino.torch  # noqa: F401  (registers the "openvino" torch.compile backend)
            from openvino.frontend.pytorch.torchdynamo import backend, execute
        except ImportError as exc:
            raise TargetError(f"target 'openvino' needs openvino ({exc}): {INSTALL}") from None
        super().setup()  # after the import: it changes dynamo's config (inline_inbuilt_nn_modules)
        self._ov, self._backend, self._execute = openvino, backend, execute
        if self.ref.is_default:
            self.build = f"openvino-{openvino.__version__}"

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "openvino": self._ov.__version__, "options": dict(OPTIONS)}

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        # OpenVINO's caches start empty for every item too: its partitioned graphs are keyed by
        # id(graph module), which a later item's freed-and-reallocated graph can reuse
        self._execute.clear_caches()
        self._backend.openvino_options = {}  # set by an aot_autograd compile, read by every later one
        compiled = super().wrap(fn)

        self._failures: list[str] = []

        def run(*args: Any, **kwargs: Any) -> Any:
            with _execution_log() as log:
                try:
                    return compiled(*args, **kwargs)
                finally:
                    self._failures = [ln.splitlines()[0][:300] for ln in log.lines if "failed" in ln]

        return run

    def compile_graph(self, gm: torch.fx.GraphModule, example_inputs: list[Any], record: Compiled) -> Callable[..., Any]:
        options = dict(OPTIONS)
        if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
            options["aot_autograd"] = True
        backend = self._backend
        inductor = backend.compile_fx

        def no_inductor(*_: Any, **__: Any) -> Any:
            exc = sys.exc_info()[1]  # OpenVINO calls this from the handler of its own failure
            why = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:500]}" if exc else "unknown"
            raise TargetError(f"OpenVINO failed to convert the graph (its backend would compile it with inductor "
                              f"instead): {why}")

        backend.compile_fx = no_inductor
        try:
            return backend.openvino(gm, example_inputs, options=options)
        finally:
            backend.compile_fx = inductor

    def batch_problem(self, record: Compiled) -> str | None:
        why = super().batch_problem(record)
        if why is None and record.fallback_kernels:
            why = f"ran in PyTorch, not OpenVINO: {', '.join(sorted(record.fallback_kernels)[:5])}"
        if why is None and record.extra.get("openvino_failed"):
            why = f"an OpenVINO subgraph failed: {record.extra['openvino_failed'][0]}"
        if why is None and not record.extra.get("openvino_subgraphs"):
            why = "OpenVINO ran no subgraph"
        return why

    def _subgraphs(self) -> list[tuple[str, Any]]:
        """The OpenVINO subgraphs of the graphs this item ran (name, OpenVINOGraphModule)."""
        out = []
        for gm in self._execute.partitioned_modules.values():
            out += [(name, m) for name, m in gm.named_children() if isinstance(m, self._execute.OpenVINOGraphModule)]
        return out

    def compiled(self) -> Compiled | None:
        record = super().compiled()
        assert record is not None
        ran = [m for _, m in self._subgraphs() if not m.perm_fallback and m.partition_id in self._execute.compiled_cache]
        inside: set[str] = set()
        outside: set[str] = set()
        for gm in self._execute.partitioned_modules.values():
            outside |= _ops(gm)
        for _, m in self._subgraphs():
            (outside if m.perm_fallback else inside).update(_ops(m.gm))
        record.graph_ops = inside | outside
        record.fallback_kernels = outside  # run by PyTorch between (or instead of) OpenVINO's subgraphs
        # how much of the item OpenVINO ran: an op both in a subgraph that ran and outside one (or in
        # a subgraph that failed) leaves graph_ops - fallback_kernels empty although a subgraph ran
        record.backend_ran = len(ran)
        record.extra = {"openvino_subgraphs": len(ran), "openvino_ops": sorted(inside),
                        "openvino_failed": list(getattr(self, "_failures", []))[:3], "openvino_device": OPTIONS["device"]}
        return record

    @contextlib.contextmanager
    def trace(self) -> Iterator[OpTrace]:
        """The eager run's overloads; those the item's compiled graphs left to PyTorch kernels
        are its fallback (the trace runs after the compiled call, see ``execute.run_item``)."""
        trace = OpTrace()
        with Dispatched(trace):
            yield trace
        record = self._record
        trace.fallback = set(record.fallback_kernels) if record is not None else set()
        trace.native = set(trace.dispatched) - trace.fallback

    def repro_compile(self) -> tuple[str, str]:
        return f"OPTIONS = {OPTIONS!r}\n{REPRO_SETUP}", "torch.compile({fn}, backend=_openvino, dynamic=False)"


def _ops(gm: torch.fx.GraphModule) -> set[str]:
    return {overload_name(n.target) for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}
