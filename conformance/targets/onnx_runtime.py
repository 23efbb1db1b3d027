"""``onnxruntime``: each sample exported with ``torch.onnx.export``'s dynamo exporter and run in
ONNX Runtime's CPU execution provider, against eager CPU.

A call of the wrapped function exports a module holding the sample (its tensors are the model's
inputs, everything else is baked in), converts it to ONNX and runs it in an
``onnxruntime.InferenceSession``. An export that fails is the target refusing the item
(:class:`~conformance.targets.base.TargetUnsupported`, status ``unsupported``, with the
exporter's innermost reason); a model ONNX Runtime cannot load or run is an ``error``; a result
that differs is a ``mismatch``. Each item's proof says what ran: the exported model's node count
and op types, the execution provider, and how many models ONNX Runtime ran (``graphs``; none is
an infrastructure error, never a pass).

In-place and ``out=`` samples keep their meaning: the module also returns its tensor inputs, and
the ones the exported program mutates are written back into the caller's tensors; an output the
program says *is* a mutated input is returned as that input, as eager returns ``self``.

Example::

    >>> import torch
    >>> from conformance.targets import get_target
    >>> t = get_target("onnxruntime")  # doctest: +SKIP
    >>> t.wrap(torch.sin)(torch.zeros(2)), t.compiled().extra["onnx_ops"]  # doctest: +SKIP
    (tensor([0., 0.]), ['Sin'])
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import torch

from .base import Compiled, Target, TargetError, TargetUnsupported, register

PROVIDER = "CPUExecutionProvider"
INSTALL = "pip install -e '.[backends]' -c constraints.txt"

_REGISTRY: Any = None  # the exporter's ONNX op registry, built once per process (4 s)


def _registry() -> Any:
    """``torch.onnx.export`` rebuilds its registry of ONNX functions on every call (4 s of the
    5 s a small export takes); the same registry, built once, is passed to the exporter's core."""
    global _REGISTRY
    if _REGISTRY is None:
        from torch.onnx._internal.exporter import _registration

        _REGISTRY = _registration.ONNXRegistry.from_torchlib()
    return _REGISTRY


def to_onnx(module: torch.nn.Module, tensors: tuple[torch.Tensor, ...]) -> Any:
    """``torch.onnx.export(module, tensors, dynamo=True)`` (an ``ONNXProgram``), with the
    registry built once. Raises :class:`TargetUnsupported` naming the step that failed and the
    innermost reason (the exporter's own first line only says which step)."""
    from torch.onnx._internal.exporter import _core

    try:
        ep = torch.export.export(module, tensors, strict=False)
    except Exception as exc:  # noqa: BLE001 - any failure to capture the graph refuses the sample
        raise TargetUnsupported(f"torch.export: {_reason(exc)}") from exc
    try:
        return _core.export(ep, registry=_registry(), verbose=False, optimize=True)
    except Exception as exc:  # noqa: BLE001 - an op with no ONNX function, or a translation failure
        raise TargetUnsupported(f"torch.onnx: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    """The innermost exception of the chain, as one line (``DispatchError: No ONNX function
    found for <OpOverload(op='aten.linalg_eig', ...)>``)."""
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    inner = seen[-1]
    lines = [ln.strip() for ln in str(inner).splitlines() if ln.strip()]
    return f"{type(inner).__name__}: {lines[0] if lines else ''}"[:1000]


# -- standalone parts: torch only, no module-level names, so that a repro script holds their source
# (repro_setup) and runs what the sweep runs ------------------------------------------------------

class _Sample(torch.nn.Module):
    """``fn`` with the sample's non-tensor arguments baked in; returns the result and each tensor
    input (cloned: the values it holds after the call, so in-place writes are seen)."""

    def __init__(self, fn: Callable[..., Any], leaves: list[Any], spec: Any, where: list[int]) -> None:
        super().__init__()
        self.fn, self.leaves, self.spec, self.where = fn, leaves, spec, where

    def forward(self, *tensors: torch.Tensor) -> Any:
        from torch.utils._pytree import tree_unflatten

        full = list(self.leaves)
        for i, t in zip(self.where, tensors, strict=True):
            full[i] = t
        args, kwargs = tree_unflatten(full, self.spec)
        return self.fn(*args, **kwargs), tuple(t.clone() for t in tensors)


def _sample_module(fn: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> tuple[_Sample, tuple[torch.Tensor, ...]]:
    """The module an exported sample is (:class:`_Sample`) and its tensor inputs, in order."""
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten((args, kwargs))
    where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    return _Sample(fn, leaves, spec, where).eval(), tuple(leaves[i] for i in where)


def _user_outputs(ep: Any) -> list[tuple[Any, torch.dtype | type | None]]:
    """Each user output's spec, with what the exported program traced it as: a tensor's dtype, the
    Python type of a scalar (``float``, ``int`` or ``bool`` for a SymFloat, SymInt or SymBool, as
    ``Tensor.item()`` returns), or None; the ONNX model's outputs are these, less the constants,
    in this order."""
    from torch.export.graph_signature import OutputKind

    def kind(val: Any) -> torch.dtype | type | None:
        if isinstance(val, torch.Tensor):
            return val.dtype
        for sym, py in ((torch.SymBool, bool), (torch.SymInt, int), (torch.SymFloat, float)):
            if isinstance(val, (sym, py)):  # bool before int: a bool is an int
                return py
        return None

    (output,) = [n for n in ep.graph.nodes if n.op == "output"]
    pairs = zip(ep.graph_signature.output_specs, output.args[0], strict=True)
    return [(spec, kind(getattr(node, "meta", {}).get("val")))
            for spec, node in pairs if spec.kind == OutputKind.USER_OUTPUT]


def _sample_result(program: Any, tensors: tuple[torch.Tensor, ...], flat: Any) -> Any:
    """The sample's result from what ONNX Runtime returned (``flat``, the model's outputs):
    constants put back, complex values rebuilt from ONNX's (..., 2) reals, a Python scalar the
    function returned (``Tensor.item()``: a 0-d tensor in ONNX, which has no other kind of value)
    made that scalar again, and every input the program mutates (in-place, ``out=``) written back
    into the caller's tensor; an output that is a mutated input's value is that input, as eager
    returns ``self`` / ``out``."""
    from torch.export.graph_signature import ConstantArgument
    from torch.utils._pytree import tree_unflatten

    ep = program.exported_program
    sig = ep.graph_signature
    outs, names, got = [], [], iter(flat)
    for spec, kind in _user_outputs(ep):
        if isinstance(spec.arg, ConstantArgument):
            outs.append(spec.arg.value)
            names.append(None)
            continue
        value = next(got)
        if isinstance(kind, torch.dtype) and kind.is_complex and not value.is_complex():
            value = torch.view_as_complex(value.contiguous())
        elif isinstance(kind, type) and value.dim() == 0 and type(value.item()) is kind:
            value = value.item()  # never a cast: an int the model returns as a float stays a tensor
        outs.append(value)
        names.append(spec.arg.name)
    _, after = tree_unflatten(outs, ep.call_spec.out_spec)
    position = {name: i for i, name in enumerate(sig.user_inputs)}
    mutated = {out: position[inp] for out, inp in sig.user_inputs_to_mutate.items()}
    with torch.no_grad():
        for i in sorted(set(mutated.values())):
            tensors[i].copy_(after[i])
    outs = [tensors[mutated[n]] if n in mutated else v for n, v in zip(names, outs, strict=True)]
    result, _ = tree_unflatten(outs, ep.call_spec.out_spec)
    return result


def _session_options(ort: Any) -> Any:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: its warnings would go into every item's output
    return options


# What a standalone repro script runs (torch, onnxscript and onnxruntime only): the sweep's export
# through the public torch.onnx.export (the registry's opset, as the sweep's _core.export keeps it),
# run in the same provider with the same options, its outputs read back by the same functions.
_REPRO_CALL = """

def _onnxruntime(fn):
    def run(*args, **kwargs):
        module, tensors = _sample_module(fn, args, kwargs)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            raise RuntimeError("ONNX Runtime runs inference only: an exported model computes no gradients")
        ep = torch.export.export(module, tensors, strict=False)
        program = torch.onnx.export(ep, (), dynamo=True, optimize=True, opset_version=OPSET,
                                   verbose=False)
        options = _session_options(onnxruntime)
        program.initialize_inference_session(
            lambda model: onnxruntime.InferenceSession(model, sess_options=options, providers=[PROVIDER]))
        return _sample_result(program, tensors, program(*tensors))

    return run"""


def _refuse_under_a_dispatch_mode() -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    mode = _get_current_dispatch_mode()
    if mode is not None:
        raise TargetError(f"exported call under an active dispatch mode ({type(mode).__name__}): "
                          "torch.export would trace the mode, not the sample")


@register
class OnnxRuntimeTarget(Target):
    name = "onnxruntime"
    description = "torch.onnx.export (dynamo) + ONNX Runtime's CPUExecutionProvider vs eager CPU"
    device = "cpu"
    compiler = True
    # a model item exports the model and compares its inference forward (conformance.models.runner)
    exports = True
    # one exported model for many samples (conformance.check.batching): an export the dynamo exporter
    # refuses for one sample is bisected down to it; that sample is unsupported on its own
    batchable = True
    # "metadata" (the CPU's strides) is left out: ONNX values have none, and the strides of the
    # tensors made from them would be this wrapper's choice, not ONNX Runtime's
    default_contracts = ("variants", "determinism")

    def setup(self) -> None:
        try:
            import onnxruntime
            import onnxscript  # noqa: F401  (the dynamo exporter's ONNX functions)
        except ImportError as exc:
            raise TargetError(f"target 'onnxruntime' needs onnxruntime and onnxscript ({exc}): {INSTALL}") from None
        if PROVIDER not in onnxruntime.get_available_providers():
            raise TargetError(f"onnxruntime {onnxruntime.__version__} has no {PROVIDER}")
        self._ort = onnxruntime
        self._record: Compiled | None = None
        if self.ref.is_default:
            self.build = f"onnxruntime-{onnxruntime.__version__}"

    def describe(self) -> dict[str, Any]:
        import onnxscript

        return {**super().describe(), "onnxruntime": self._ort.__version__, "onnxscript": onnxscript.__version__,
                "provider": PROVIDER}

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        record = Compiled(backend="onnxruntime")
        self._record = record

        def run(*args: Any, **kwargs: Any) -> Any:
            _refuse_under_a_dispatch_mode()
            module, tensors = _sample_module(fn, args, kwargs)
            if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
                raise TargetUnsupported("ONNX Runtime runs inference only: an exported model computes no gradients")
            t0 = time.perf_counter()
            program = to_onnx(module, tensors)
            record.compile_s += time.perf_counter() - t0
            return self._run(program, tensors, record)

        return run

    def _run(self, program: Any, tensors: tuple[torch.Tensor, ...], record: Compiled) -> Any:
        ep = program.exported_program
        proto = program.model_proto
        record.graph_ops |= _aten_ops(ep.graph_module)
        nodes = [n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in proto.graph.node]
        t0 = time.perf_counter()
        session = self._session(program)
        record.compile_s += time.perf_counter() - t0
        try:
            flat = program(*tensors)  # ONNXProgram feeds the session: bfloat16 and complex inputs converted
        except TypeError as exc:
            # the session takes dense arrays: a sparse input exported, but cannot be fed
            sparse = [f"input {i} is {str(t.layout).removeprefix('torch.')}" for i, t in enumerate(tensors)
                      if t.layout != torch.strided]
            if not sparse:
                raise
            raise TargetUnsupported(f"ONNX Runtime takes dense inputs only ({', '.join(sparse)}): {exc}") from exc
        record.graphs += 1
        record.extra = {"onnx_nodes": len(nodes), "onnx_ops": sorted(set(nodes)), "opset": _opset(proto),
                        "provider": session.get_providers()[0], "ort_runs": record.graphs}
        return _sample_result(program, tensors, flat)

    def _session(self, program: Any) -> Any:
        def start(model: str | bytes) -> Any:
            return self._ort.InferenceSession(model, sess_options=_session_options(self._ort), providers=[PROVIDER])

        program.initialize_inference_session(start)
        return program._inference_session

    def compiled(self) -> Compiled | None:
        return self._record or Compiled(backend="onnxruntime")

    def compile_backend(self) -> str:
        raise TargetError("target 'onnxruntime' exports samples, it is no torch.compile backend: "
                          "model graphs (--models) are not run on it")

    def repro_setup(self) -> tuple[str, str]:
        """The script exports and runs each call as :meth:`wrap` does, with this module's own
        functions (their source) and no harness import."""
        parts = [inspect.getsource(f)
                 for f in (_Sample, _sample_module, _user_outputs, _sample_result, _session_options)]
        opset = _registry().opset_version
        setup = (f"import onnxruntime\n\nPROVIDER = {PROVIDER!r}\nOPSET = {opset!r}\n\n\n"
                 + "\n\n".join(parts) + _REPRO_CALL)
        return setup, "_onnxruntime({fn})"


def _aten_ops(gm: torch.fx.GraphModule) -> set[str]:
    from .base import overload_name

    return {overload_name(n.target) for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}


def _opset(proto: Any) -> int | None:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
