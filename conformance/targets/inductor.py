"""``inductor``: ``torch.compile`` (inductor) on the CPU against eager CPU.

:class:`CompilerTarget` is the device-generic part: every :meth:`~CompilerTarget.wrap` starts
dynamo afresh and compiles through a counting backend, so each item records how many graphs
its backend compiled (:class:`~conformance.targets.base.Compiled`), and a call that would run
eager (an active dispatch mode, a leaked ``no_dispatch``) fails instead of passing silently.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .base import Compiled, Target, TargetError, overload_name, register


def configure_dynamo() -> None:
    """Dynamo settings under which a compile failure is an error, never a silent eager run."""
    import torch._dynamo

    cfg = torch._dynamo.config
    cfg.suppress_errors = False  # a backend failure raises instead of running the frame eager
    # Each item starts from torch._dynamo.reset(), so no limit is reached by a healthy sweep;
    # one that is (a sample that recompiles in a loop) fails rather than drifting to eager.
    cfg.fail_on_recompile_limit_hit = True


# Dynamo captures what its defaults break the graph at: ops whose output shape depends on the
# data (nonzero, unique, masked_select, ...: "Dynamic shape operator") and Tensor.item() ("Data
# dependent operator", in gaussian_nll_loss, cov, allclose, ...). With the defaults such an op ran
# eager, compiled no graph, and its every item was an infrastructure error: the compiler was never
# tested on it. PyTorch's own Inductor OpInfo test lets those samples run eager unchecked
# (nopython=False, check_has_compiled=False); here the backend gets the graph, with unbacked
# symbolic sizes, as it does under torch.export or fullgraph=True with these settings.
CAPTURE = {"capture_dynamic_output_shape_ops": True, "capture_scalar_outputs": True}


class _LoggedBreaks(logging.Handler):
    """The reasons in dynamo's graph-break log. ``counters["graph_break"]`` counts the breaks of
    dynamo's Unsupported kind only; a guard on a data-dependent value (gaussian_nll_loss's
    ``if torch.any(var < 0)`` once scalar outputs are captured) also makes the frame run eager,
    and only the log says why."""

    LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"  # torch._logging's artifact "graph_breaks"

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        lines = iter(record.getMessage().splitlines())
        for line in lines:
            if line.startswith("Graph Break Reason:"):
                why = next((x.strip() for x in lines if x.strip()), "")  # the first line of the cause
                self.reasons.append(f"{line.removeprefix('Graph Break Reason:').strip()} {why}".strip())
                return

    @classmethod
    def installed(cls) -> _LoggedBreaks:
        log = logging.getLogger(cls.LOGGER)
        handler = next((h for h in log.handlers if isinstance(h, cls)), None)
        if handler is None:
            handler = cls()
            log.addHandler(handler)
            if log.getEffectiveLevel() > logging.DEBUG:  # not asked for (TORCH_LOGS): read, not printed
                log.setLevel(logging.DEBUG)
                log.propagate = False
        return handler


def _python_dispatch_excluded() -> bool:
    return torch._C._dispatch_tls_local_exclude_set().has(torch._C.DispatchKey.Python)


def check_can_compile() -> None:
    """Raise :class:`TargetError` when ``torch.compile`` would not compile in this thread now."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    mode = _get_current_dispatch_mode()
    if mode is not None:
        raise TargetError(f"compiled call under an active dispatch mode ({type(mode).__name__}): "
                          "torch.compile would run it eager")
    if _python_dispatch_excluded():
        raise TargetError("the Python dispatch key is excluded in this thread (a no_dispatch() "
                          "or _DisableTorchDispatch left active): dynamo cannot make fake tensors")


class CompilerTarget(Target):
    """A ``torch.compile`` backend on the CPU, compared with eager CPU."""

    compiler = True
    batchable = True
    device = "cpu"
    backend_name = ""

    def setup(self) -> None:
        configure_dynamo()
        self._record: Compiled | None = None

    def compile_graph(self, gm: torch.fx.GraphModule, example_inputs: list[Any], record: Compiled) -> Callable[..., Any]:
        """Compile one dynamo graph (default: the registered backend ``backend_name``)."""
        import torch._dynamo

        return torch._dynamo.lookup_backend(self.backend_name)(gm, example_inputs)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        import torch._dynamo
        from torch._dynamo.utils import counters

        # A fresh dynamo for every item. Without it, builtin ops (torch.add, torch.sin, ...)
        # share dynamo's one wrapper frame, whose recompile limit a worker soon reaches; from
        # then on every op of that worker ran eager, silently.
        torch._dynamo.reset()
        counters.clear()
        _LoggedBreaks.installed().reasons.clear()
        record = Compiled(backend=self.backend_name)
        self._record = record

        def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            record.graphs += 1
            t0 = time.perf_counter()
            try:
                return self.compile_graph(gm, example_inputs, record)
            finally:
                record.compile_s += time.perf_counter() - t0

        compiled = torch.compile(fn, backend=backend, dynamic=False, fullgraph=False)

        def run(*args: Any, **kwargs: Any) -> Any:
            from torch._dynamo.exc import BackendCompilerFailed

            check_can_compile()
            try:
                with _seeded_outside(), torch._dynamo.config.patch(CAPTURE):
                    return compiled(*args, **kwargs)
            except BackendCompilerFailed as exc:  # its first line does not say why
                inner = exc.inner_exception
                why = str(inner).strip().splitlines()[0] if str(inner).strip() else ""
                raise TargetError(f"backend {self.backend_name!r} failed to compile a graph: "
                                  f"{type(inner).__name__}: {why}") from exc

        return run

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "dynamo": dict(CAPTURE)}

    def compiled(self) -> Compiled | None:
        from torch._dynamo.utils import counters

        record = self._record or Compiled(backend=self.backend_name)
        record.frames = int(counters["frames"].get("ok", 0))
        logged = _LoggedBreaks.installed().reasons
        record.graph_breaks = max(int(sum(counters["graph_break"].values())), len(logged))
        counted = {str(k).strip().splitlines()[0][:200] for k in counters["graph_break"]}
        # a logged break that the counters hold too is the same break, in longer words
        record.break_reasons = sorted(counted | {r[:200] for r in logged if not any(c in r for c in counted)})
        return record

    @contextlib.contextmanager
    def standing_for(self, record: Compiled | None) -> Iterator[None]:
        held = self._record
        if record is not None:
            self._record = record
        try:
            yield
        finally:
            self._record = held

    def compile_backend(self) -> str | Callable[..., Any]:
        return self.backend_name

    def repro_setup(self) -> tuple[str, str]:
        """The script compiles ``{fn}`` as :meth:`repro_compile` says and calls it as :meth:`wrap`
        does: inside :func:`_seeded_outside`, so that an OpInfo whose op goes through
        ``wrapper_set_seed`` compiles the same graph in the script as in the sweep; a call that
        compiled no graph raises there, as it fails in the sweep (never an eager pass). Dynamo
        captures what the sweep's does (:data:`CAPTURE`)."""
        setup, call = self.repro_compile()
        capture = "import torch._dynamo\n" + "".join(f"torch._dynamo.config.{k} = {v!r}\n" for k, v in CAPTURE.items())
        return (capture + setup + "\n\n" + REPRO_COMPILED_CALL).strip(), f"_seeded_outside({call})"

    def repro_compile(self) -> tuple[str, str]:
        """Setup source and the ``torch.compile`` call of ``{fn}`` a repro script makes."""
        return "", f"torch.compile({{fn}}, backend={self.backend_name!r}, dynamic=False)"


@register
class InductorTarget(CompilerTarget):
    name = "inductor"
    description = "torch.compile(backend='inductor') on CPU vs eager CPU"
    backend_name = "inductor"

    def setup(self) -> None:
        super().setup()
        self._own_rng = True
        if self.ref.is_default:
            self.build = f"{self.name}-{torch.__version__}"  # inductor-2.13.0+cpu, inductor-strict-...

    def use_own_rng(self, own: bool) -> None:
        # Inductor lowers random ops to its own generator (Philox), whose numbers differ from
        # eager's for the same seed: attention's dropout mask differed, and every such sample of
        # multi_head_attention_forward and scaled_dot_product_attention was a false mismatch.
        # fallback_random makes the compiled graph call ATen's random kernels (the same numbers);
        # random OpInfos keep Inductor's own lowering, compared by distribution.
        self._own_rng = own

    def repro_compile(self) -> tuple[str, str]:
        setup = "" if self._own_rng else "import torch._inductor.config\ntorch._inductor.config.fallback_random = True"
        return setup, "torch.compile({fn}, backend='inductor', dynamic=False)"

    def compile_graph(self, gm: torch.fx.GraphModule, example_inputs: list[Any], record: Compiled) -> Callable[..., Any]:
        import torch._inductor.config

        with torch._inductor.config.patch(fallback_random=not self._own_rng):
            return self._compile(gm, example_inputs, record)

    def _compile(self, gm: torch.fx.GraphModule, example_inputs: list[Any], record: Compiled) -> Callable[..., Any]:
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        def inner(graph: torch.fx.GraphModule, inputs: list[Any], **kwargs: Any) -> Any:
            record.graph_ops |= aten_ops(graph)
            record.fallback_kernels |= {overload_name(op) for op in _ops(graph) if not _lowered(op)}
            return compile_fx_inner(graph, inputs, **kwargs)

        # An AOTAutograd cache hit skips inner_compile, and with it the graph's evidence; the
        # FX graph cache (inside compile_fx_inner) still spares most of the work.
        with torch._functorch.config.patch(enable_autograd_cache=False):
            return compile_fx(gm, example_inputs, inner_compile=inner)


@register
class InductorStrictTarget(InductorTarget):
    """Inductor as PyTorch's own Inductor OpInfo tests configure it (``implicit_fallbacks=False``,
    ``test/inductor/test_torchinductor_opinfo.py``): an op Inductor has no lowering for is a
    compile error ("missing lowering") instead of a call of its ATen kernel. What the default
    ``inductor`` target records as ``proof.fallback_kernels`` fails here, so its findings are the
    ones upstream's expected-failure lists are written against."""

    name = "inductor-strict"
    description = "torch.compile(backend='inductor') with implicit_fallbacks=False (upstream's OpInfo test setting) vs eager CPU"

    def repro_compile(self) -> tuple[str, str]:
        setup, call = super().repro_compile()
        return ("import torch._inductor.config\ntorch._inductor.config.implicit_fallbacks = False\n" + setup).strip(), call

    def compile_graph(self, gm: torch.fx.GraphModule, example_inputs: list[Any], record: Compiled) -> Callable[..., Any]:
        import torch._inductor.config

        with torch._inductor.config.patch(implicit_fallbacks=False):
            return super().compile_graph(gm, example_inputs, record)


# How a standalone repro script (torch only) calls the compiled callable, as the sweep does:
# seeded outside (see _seeded_outside), and a call that compiled no graph is not the compiler's
# result (the sweep's "compiled no graph" infra error, or a layout the compiler refused).
REPRO_COMPILED_CALL = """from torch._dynamo.utils import counters as _dynamo_counters
from torch.testing._internal import common_methods_invocations as _cmi
from torch.testing._internal.common_utils import freeze_rng_state as _freeze_rng_state


def _seeded_outside(compiled):
    # OpInfo's wrapper_set_seed (seed 42, then the op) calls the op alone while it is compiled,
    # and the seeding happens around the compiled call
    def run(*args, **kwargs):
        seeded = _cmi.wrapper_set_seed
        _cmi.wrapper_set_seed = lambda op, *a, **k: op(*a, **k)
        _dynamo_counters.clear()
        try:
            with _freeze_rng_state():
                torch.manual_seed(42)
                result = compiled(*args, **kwargs)
        finally:
            _cmi.wrapper_set_seed = seeded
        if not _dynamo_counters["stats"]["unique_graphs"]:
            breaks = sorted({str(k).strip().splitlines()[0][:200] for k in _dynamo_counters["graph_break"]})
            raise RuntimeError("torch.compile compiled no graph and ran the call eager (graph breaks: "
                               + ("; ".join(breaks) or "none") + ")")
        return result

    return run"""


@contextlib.contextmanager
def _seeded_outside() -> Iterator[None]:
    """OpInfo's random ops call their op through ``wrapper_set_seed`` (freeze the RNG state, seed
    42, call), and dynamo skips ``torch.manual_seed``: traced, such a sample compiled no graph.
    As PyTorch's own inductor OpInfo tests do, the wrapper only calls the op while compiling, and
    the same seeding happens here, around the compiled call; the random values then come from the
    same seed as the eager reference's."""
    try:
        from torch.testing._internal import common_methods_invocations as cmi
    except ImportError:  # no OpInfo in this process (an audit, a model)
        yield
        return
    from torch.testing._internal.common_utils import freeze_rng_state

    seeded = cmi.wrapper_set_seed
    cmi.wrapper_set_seed = _call
    try:
        with freeze_rng_state():
            torch.manual_seed(42)
            yield
    finally:
        cmi.wrapper_set_seed = seeded


def _call(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return op(*args, **kwargs)


def _ops(graph: torch.fx.GraphModule) -> list[torch._ops.OpOverload]:
    return [n.target for n in graph.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]


def aten_ops(graph: torch.fx.GraphModule) -> set[str]:
    """The overloads an ATen-level FX graph calls."""
    return {overload_name(op) for op in _ops(graph)}


def _lowered(op: torch._ops.OpOverload) -> bool:
    """Does inductor generate code for ``op`` (rather than call its ATen kernel)? An op without a
    lowering becomes an implicit fallback; decided from the tables, so a cache hit says the same."""
    from torch._inductor import lowering

    return op in lowering.lowerings and op not in lowering.fallbacks
