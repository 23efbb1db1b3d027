"""The fused RNN cells, as device kernels.

PyTorch's LSTM and GRU cells call ``aten::_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell`` (and
their backward kernels) on any CUDA, XPU or PrivateUse1 device; the CPU has no kernel for them,
so a CPU fallback cannot run them. A build that lists them as native runs these kernels (the
``ideal`` build does: it lists every op); any other build fails as a device whose CPU fallback
meets them fails (the dispatcher's own "Could not run ... 'CPU' backend" error). The kernels follow
the CUDA ones: gates summed with the biases, activated in the accumulation type (float32 for
16-bit inputs), the activated gates kept as the workspace the backward reads.
"""

from __future__ import annotations

from typing import Any

import torch

from .routing import S
from .tracking import raw, record

_LSTM = "aten::_thnn_fused_lstm_cell.default"
_LSTM_BW = "aten::_thnn_fused_lstm_cell_backward_impl.default"
_GRU = "aten::_thnn_fused_gru_cell.default"
_GRU_BW = "aten::_thnn_fused_gru_cell_backward.default"


def _native(name: str) -> bool:
    """Whether the active build has this kernel; counts the call (native, or a fallback)."""
    native = S.build.is_native(name)
    record(name, not native)
    return native


def _on_cpu(op: Any, args: tuple) -> Any:
    """The call as a CPU fallback makes it: the CPU has no kernel, so the dispatcher refuses."""
    with raw(2):
        return op(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])


def _acc(*ts: torch.Tensor | None) -> list[torch.Tensor | None]:
    """``ts`` in their accumulation type (float32 for 16-bit floats), as the CUDA kernels compute."""
    return [t.float() if t is not None and t.dtype in (torch.float16, torch.bfloat16) else t for t in ts]


def lstm_cell(input_gates: torch.Tensor, hidden_gates: torch.Tensor, cx: torch.Tensor,
              input_bias: torch.Tensor | None = None, hidden_bias: torch.Tensor | None = None):
    if not _native(_LSTM):
        return _on_cpu(torch.ops.aten._thnn_fused_lstm_cell.default, (input_gates, hidden_gates, cx, input_bias,
                                                                      hidden_bias))
    dtype = input_gates.dtype
    with raw(1):
        ig, hg, c, ib, hb = _acc(input_gates, hidden_gates, cx, input_bias, hidden_bias)
        gates = ig + hg
        if ib is not None:
            gates = gates + ib + hb
        i, f, g, o = gates.chunk(4, 1)
        i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
        cy = f * c + i * g
        hy = o * cy.tanh()
        workspace = torch.cat([i, f, g, o], 1)
        return hy.to(dtype), cy.to(dtype), workspace.to(dtype)


def lstm_cell_backward(grad_hy: torch.Tensor | None, grad_cy: torch.Tensor | None, cx: torch.Tensor,
                       cy: torch.Tensor, workspace: torch.Tensor, has_bias: bool):
    if not _native(_LSTM_BW):
        return _on_cpu(torch.ops.aten._thnn_fused_lstm_cell_backward_impl.default,
                       (grad_hy, grad_cy, cx, cy, workspace, has_bias))
    dtype = workspace.dtype
    with raw(1):
        gh, gc, c, cyy, ws = _acc(grad_hy, grad_cy, cx, cy, workspace)
        i, f, g, o = ws.chunk(4, 1)
        tanh_cy = cyy.tanh()
        gh = torch.zeros_like(tanh_cy) if gh is None else gh
        gcy = (torch.zeros_like(tanh_cy) if gc is None else gc) + gh * o * (1 - tanh_cy * tanh_cy)
        grad_gates = torch.cat([gcy * g * i * (1 - i), gcy * c * f * (1 - f), gcy * i * (1 - g * g),
                                gh * tanh_cy * o * (1 - o)], 1)
        grad_cx = gcy * f
        grad_bias = grad_gates.sum(0) if has_bias else torch.empty(0, device=workspace.device)
        return grad_gates.to(dtype), grad_cx.to(dtype), grad_bias.to(dtype)


def gru_cell(input_gates: torch.Tensor, hidden_gates: torch.Tensor, hx: torch.Tensor,
             input_bias: torch.Tensor | None = None, hidden_bias: torch.Tensor | None = None):
    if not _native(_GRU):
        return _on_cpu(torch.ops.aten._thnn_fused_gru_cell.default, (input_gates, hidden_gates, hx, input_bias,
                                                                     hidden_bias))
    dtype = input_gates.dtype
    with raw(1):
        ig, hg, h, ib, hb = _acc(input_gates, hidden_gates, hx, input_bias, hidden_bias)
        if ib is not None:
            ig, hg = ig + ib, hg + hb
        ir, ii, in_ = ig.chunk(3, 1)
        hr, hi, hn = hg.chunk(3, 1)
        r = (ir + hr).sigmoid()
        z = (ii + hi).sigmoid()
        n = (in_ + r * hn).tanh()
        hy = n + z * (h - n)
        workspace = torch.cat([r, z, n, h, hn], 1)
        return hy.to(dtype), workspace.to(dtype)


def gru_cell_backward(grad_hy: torch.Tensor, workspace: torch.Tensor, has_bias: bool):
    if not _native(_GRU_BW):
        return _on_cpu(torch.ops.aten._thnn_fused_gru_cell_backward.default, (grad_hy, workspace, has_bias))
    dtype = workspace.dtype
    with raw(1):
        gh, ws = _acc(grad_hy, workspace)
        r, z, n, h, hn = ws.chunk(5, 1)
        d_n = gh * (1 - z) * (1 - n * n)
        d_r = d_n * hn * r * (1 - r)
        d_z = gh * (h - n) * z * (1 - z)
        grad_input = torch.cat([d_r, d_z, d_n], 1)
        grad_hidden = torch.cat([d_r, d_z, d_n * r], 1)
        grad_hx = gh * z
        empty = torch.empty(0, device=workspace.device)
        grad_ib = grad_input.sum(0) if has_bias else empty
        grad_hb = grad_hidden.sum(0) if has_bias else empty
        return tuple(t.to(dtype) for t in (grad_input, grad_hidden, grad_hx, grad_ib, grad_hb))


KERNELS = {"_thnn_fused_lstm_cell": lstm_cell, "_thnn_fused_lstm_cell_backward_impl": lstm_cell_backward,
           "_thnn_fused_gru_cell": gru_cell, "_thnn_fused_gru_cell_backward": gru_cell_backward}
