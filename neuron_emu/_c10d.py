"""The machinery of the c10d backend "neuron" (:mod:`neuron_emu.distributed`): tensor specs and
their bytes, reductions, the gloo transport's exchanges, defect firing, cross-rank validation,
point-to-point messages and the Work objects.  :class:`GroupCore` is the process group's base;
:class:`neuron_emu.distributed.NeuronProcessGroup` adds the collectives.

A collective (:meth:`GroupCore._collective`) all-gathers every rank's description (JSON: specs --
``[dtype name, shape]`` --, reduce op, root, split sizes), lets the caller validate them (the same
verdict on every rank), fires the build's ``c10d::`` defects, then all-gathers every rank's payload
(its tensors' bytes, each 16-byte aligned).  A point-to-point message is a fixed header (magic,
byte count, dtype, numel) and the payload, on the gloo tag the caller gave.
"""

from __future__ import annotations

import json
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from . import defects as _defects
from .manifest import C10D_ALIASES, C10D_COLLECTIVES, C10D_PREFIX, Build, Defect
from .routing import S
from .tracking import raw

BACKEND = "neuron"

#: ProcessGroup method (as torch.distributed 2.13 and the functional collectives call it, old
#: names included) -> the torch.distributed function a ``c10d::`` defect names.
METHOD_COLLECTIVE: dict[str, str] = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "allgather": "all_gather",
    "allgather_coalesced": "all_gather_coalesced",
    "all_gather_single": "all_gather_into_tensor",
    "_allgather_base": "all_gather_into_tensor",
    "all_gather_single_coalesced": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "broadcast": "broadcast",
    "all_to_all_single": "all_to_all_single",
    "alltoall_base": "all_to_all_single",
    "alltoall": "all_to_all",
    "send": "send",
    "recv": "recv",
    "recv_anysource": "recv",
    "barrier": "barrier",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
}
assert set(METHOD_COLLECTIVE.values()) == set(C10D_COLLECTIVES) - set(C10D_ALIASES)


def collective_names(name: str) -> tuple[str, ...]:
    """The ``c10d::`` names a defect may give collective `name` by (its torch 2.13 aliases too)."""
    return (C10D_PREFIX + name, *(C10D_PREFIX + a for a, n in C10D_ALIASES.items() if n == name))


_ALIGN = 16                 # every tensor's bytes start 16-byte aligned in a payload
_P2P_HEADER = 4             # int64s: magic, nbytes, dtype index, numel
_P2P_MAGIC = 0x4E45555230   # "NEUR0"
_DTYPES = tuple(getattr(torch, n) for n in (
    "float32", "float64", "float16", "bfloat16", "complex64", "complex128", "complex32", "uint8", "int8",
    "int16", "int32", "int64", "bool", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2",
    "float8_e4m3fnuz", "float8_e5m2fnuz",
) if isinstance(getattr(torch, n, None), torch.dtype))
_LOWP = (torch.bfloat16, torch.float16)


# ------------------------------------------------------------------------------ tensor helpers
def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def spec(t: torch.Tensor) -> list:
    return [dtype_name(t.dtype), list(t.shape)]


def is_spec(x) -> bool:
    return isinstance(x, list) and len(x) == 2 and isinstance(x[0], str)


def flat_specs(xs) -> list:
    """The tensor specs in `xs`, a (nested) list of them."""
    return [x for x in xs if is_spec(x)] + [s for x in xs if not is_spec(x) for s in flat_specs(x)]


def fmt(s: list) -> str:
    """A spec as "dtype[d0, d1]"."""
    return f"{s[0]}[{', '.join(map(str, s[1]))}]"


def numel(s: list) -> int:
    n = 1
    for d in s[1]:
        n *= d
    return n


def _nbytes(s: list) -> int:
    return numel(s) * torch.empty((), dtype=_dtype(s[0])).element_size()


def _round(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def check_tensor(t, what: str = "tensor") -> torch.Tensor:
    """The local checks a real backend makes before communicating."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"neuron c10d: {what} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"neuron c10d: only dense tensors are supported, got a {t.layout} {what}")
    if t.device.type not in ("neuron", "cpu"):
        raise ValueError(f"neuron c10d: {what} is on {t.device}; the neuron backend takes neuron tensors")
    if not t.is_contiguous():
        raise ValueError("Tensors must be contiguous")
    return t


def check_tensors(ts, what: str = "tensor") -> list[torch.Tensor]:
    return [check_tensor(t, what) for t in ts]


def _cpu(t: torch.Tensor) -> torch.Tensor:
    """t's values on the CPU, without the emulator counting the copy as a user op."""
    if t.device.type == "cpu":
        return t.detach()
    with raw(2):
        return t.detach().cpu()


def pack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors' bytes, each starting at a multiple of _ALIGN, in one uint8 CPU tensor."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    buf = torch.zeros(sum(_round(s) for s in sizes), dtype=torch.uint8)
    off = 0
    for t, s in zip(tensors, sizes, strict=True):
        if s:
            buf[off:off + s] = _cpu(t).reshape(-1).view(torch.uint8)
        off += _round(s)
    return buf


def unpack(buf: torch.Tensor, specs: list) -> list[torch.Tensor]:
    """The CPU tensors (views of `buf`) that :func:`pack` packed, given their specs."""
    out, off = [], 0
    for sp in specs:
        n = _nbytes(sp)
        dt = _dtype(sp[0])
        if n:
            out.append(buf[off:off + n].view(dt).view(sp[1]))
        else:
            out.append(torch.empty(sp[1], dtype=dt))
        off += _round(n)
    return out


def write_back(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Writes CPU values `src` into the (neuron or CPU) tensor `dst` in place."""
    if dst.numel() == 0:
        return
    src = src.reshape(dst.shape)
    if dst.device.type == "cpu":
        dst.detach().copy_(src)
        return
    with raw(2):
        dst.detach().copy_(src)


def done(result) -> dist.Work:
    fut: Future = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


# ----------------------------------------------------------------------------------- reductions
def op_name(opts) -> str:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    op = getattr(op, "op", op)  # a ReduceOp wraps its RedOpType
    return op.name


_BITWISE = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}
_BOOL = {"SUM": torch.logical_or, "MAX": torch.logical_or, "BOR": torch.logical_or,
         "PRODUCT": torch.logical_and, "MIN": torch.logical_and, "BAND": torch.logical_and,
         "BXOR": torch.logical_xor}


def check_op(op: str, dtype: torch.dtype) -> None:
    if op not in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"):
        raise ValueError(f"neuron c10d: ReduceOp.{op} is not supported by the neuron backend")
    if dtype == torch.bool:
        if op == "AVG":
            raise ValueError("neuron c10d: ReduceOp.AVG is not supported on bool tensors")
        return
    if op in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"neuron c10d: ReduceOp.{op} needs integer or bool tensors, got {dtype_name(dtype)}")
    if op in ("MIN", "MAX") and dtype.is_complex:
        raise ValueError(f"neuron c10d: ReduceOp.{op} is not defined for complex tensors ({dtype_name(dtype)})")


def reduce_values(xs: list[torch.Tensor], op: str, accumulate: str) -> torch.Tensor:
    """The reduction of the ranks' values `xs` (rank order) as a new CPU tensor of their dtype:
    the same arithmetic, in the same order, on every rank."""
    dt = xs[0].dtype
    if dt == torch.bool:
        acc = xs[0].clone()
        for x in xs[1:]:
            acc = _BOOL[op](acc, x)
        return acc
    wide = op in ("SUM", "PRODUCT", "AVG") and dt in _LOWP and accumulate == "fp32"
    acc = xs[0].to(torch.float32) if wide else xs[0].clone()
    for x in xs[1:]:
        x = x.to(acc.dtype)
        if op in ("SUM", "AVG"):
            acc = acc + x
        elif op == "PRODUCT":
            acc = acc * x
        elif op == "MIN":
            acc = torch.minimum(acc, x)
        elif op == "MAX":
            acc = torch.maximum(acc, x)
        else:
            acc = _BITWISE[op](acc, x)
    if op == "AVG":
        n = len(xs)
        acc = torch.div(acc, n, rounding_mode="trunc") if not (dt.is_floating_point or dt.is_complex) else acc / n
    return acc.to(dt)


# ------------------------------------------------------------------------------ process group
class _P2PWork(dist.distributed_c10d.Work):
    """The Work of a send or receive: wait() completes it (a receive copies into its tensor)."""

    def __init__(self, finish, result):
        super().__init__()
        self._finish = finish
        self._result = result
        self._src = -1
        self._fut: Future = Future()
        self._completed = False
        self._error: BaseException | None = None

    def wait(self, timeout: timedelta | None = None) -> bool:  # noqa: ARG002 - the group's timeout rules
        if not self._completed:
            self._completed = True
            try:
                self._src = self._finish()
                self._fut.set_result(self._result)
            except BaseException as e:
                self._error = e
                self._fut.set_exception(e)
                raise
        elif self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._completed

    def is_success(self) -> bool:
        return self._completed and self._error is None

    def get_future(self) -> Future:
        return self._fut

    def result(self):
        return self._result

    def _source_rank(self) -> int:
        return self._src


class GroupCore(dist.ProcessGroup):
    """The machinery of the "neuron" process group: a gloo CPU group moves the bytes; the
    collective driver, defect firing and cross-rank validation; point-to-point send and receive."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._transport = dist.ProcessGroupGloo(dist.PrefixStore("neuron_emu/transport/", store), rank, size, timeout)
        # The transport also stands as the group's backend for "neuron": it keeps the group's name
        # (c10d stores it on a backend), and the group reports the device it serves.
        self._register_backend(torch.device("neuron"), dist.ProcessGroup.BackendType.CUSTOM, self._transport)
        self._defect_build: Build | None = None
        self._defect_state: _defects.DefectState | None = None

    def getBackendName(self) -> str:
        return BACKEND

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self._rank}, size={self._size})"

    # ---------------------------------------------------------------- transport and defects
    def _allgather_var(self, buf: torch.Tensor, lengths: list[int], force: bool = False) -> list[torch.Tensor]:
        """Every rank's uint8 `buf` (rank r's holds lengths[r] bytes), in rank order."""
        n = self._size
        m = _round(max(lengths, default=0))
        if m == 0:
            if not force:
                return [torch.empty(0, dtype=torch.uint8) for _ in range(n)]
            m = _ALIGN
        padded = torch.zeros(m, dtype=torch.uint8)
        padded[:buf.numel()] = buf
        out = torch.empty(n * m, dtype=torch.uint8)
        self._transport._allgather_base(out, padded).wait()
        return [out[r * m:r * m + lengths[r]] for r in range(n)]

    def _describe(self, desc: dict, payload_len: int) -> tuple[list[dict], list[int]]:
        """Every rank's description (JSON-able) and payload length, in rank order."""
        blob = json.dumps(desc, sort_keys=True).encode()
        head = torch.tensor([len(blob), payload_len], dtype=torch.int64)
        heads = torch.empty(self._size * 2, dtype=torch.int64)
        self._transport._allgather_base(heads, head).wait()
        heads = heads.view(self._size, 2).tolist()
        raw_descs = self._allgather_var(torch.frombuffer(bytearray(blob), dtype=torch.uint8), [h[0] for h in heads])
        return [json.loads(bytes(d.numpy())) for d in raw_descs], [h[1] for h in heads]

    def _defects(self) -> tuple[Build, _defects.DefectState]:
        b = S.build
        if self._defect_build is not b:   # a new build: its own call counters, as use_build resets
            self._defect_build = b
            self._defect_state = _defects.DefectState(b.name, b.defects)
        return b, self._defect_state

    def _firing(self, name: str, specs: list) -> list[Defect]:
        """The c10d defects of the active build that fire for collective `name` over tensors of
        `specs` (every rank's for a collective: the same answer on every rank of the group; the
        calling rank's for a point-to-point call)."""
        b, st = self._defects()
        names = collective_names(name)
        dtypes = {s[0] for s in specs}
        biggest = max((numel(s) for s in specs), default=0)
        out = []
        for i, d in enumerate(st.defects):
            if not d.is_c10d or not any(d.matches_name(q) for q in names):
                continue
            if d.world_sizes is not None and self._size not in d.world_sizes:
                continue
            if d.dtypes is not None and not dtypes & set(d.dtypes):
                continue
            if d.min_numel and biggest < d.min_numel:
                continue
            if st.roll(i):
                st.fired[i] += 1
                out.append(d)
        return out

    def _act(self, name: str, fired: list[Defect], local: bool = False) -> bool:
        """Acts on the fired error/crash/hang defects: error raises (on every rank); crash and
        hang take one rank -- the group's last, or the calling rank of a point-to-point `local`
        call -- and the others go on into the transport, where they block.  True where this rank
        must block there."""
        b = S.build
        for d in fired:
            if d.kind == "error":
                _defects.raise_now(d, C10D_PREFIX + name, b.name)
            if d.kind in ("crash", "hang"):
                if local or self._rank == self._size - 1:
                    _defects.raise_now(d, C10D_PREFIX + name, b.name)
                return True
        return False

    @staticmethod
    def _perturb(fired: list[Defect], outputs: list[torch.Tensor]) -> None:
        for d in fired:
            if d.kind in ("wrong_result", "nan"):
                _defects.perturb_outputs(d, outputs)

    def _collective(self, method: str, desc: dict, payload: torch.Tensor, validate) -> tuple[list[dict], list, list[Defect]]:
        """One collective: exchanges descriptions, lets `validate(descs)` raise (alike on every
        rank), fires the defects, exchanges payloads.  Returns the descriptions, each rank's
        payload and the fired defects that act on the outputs."""
        name = METHOD_COLLECTIVE[method]
        descs, lengths = self._describe(desc, payload.numel())
        problem = validate(descs)
        if problem:
            raise RuntimeError(f"neuron c10d::{name}: {problem}")
        fired = self._firing(name, [s for d in descs for s in d.get("specs", [])])
        block = self._act(name, fired)
        payloads = self._allgather_var(payload, lengths, force=block)
        if block:
            raise RuntimeError(f"neuron c10d::{name}: a peer rank failed (injected defect)")
        return descs, payloads, fired

    # ------------------------------------------------------------------------- validation
    def _same(self, descs: list[dict], key: str, what: str) -> str | None:
        vals = [d[key] for d in descs]
        if all(v == vals[0] for v in vals):
            return None
        shown = "; ".join(f"rank {r}: {self._show(key, v)}" for r, v in enumerate(vals))
        return f"the ranks' {what} differ ({shown}); every rank must pass the same"

    @staticmethod
    def _show(key: str, v) -> str:
        if key in ("in", "specs", "outs") and isinstance(v, list):
            return ", ".join(fmt(s) if is_spec(s) else str(s) for s in v)
        return str(v)

    @staticmethod
    def _first(*problems) -> str | None:
        return next((p for p in problems if p), None)

    # ------------------------------------------------------------------------ point to point
    def _p2p_defects(self, name: str, t: torch.Tensor) -> list[Defect]:
        fired = self._firing(name, [spec(t)])
        self._act(name, fired, local=True)
        return fired

    def send(self, tensors, dst_rank, tag=0):
        (t,) = check_tensors(tensors)
        fired = self._p2p_defects("send", t)
        data = _cpu(t).clone()
        self._perturb(fired, [data])
        dt = _DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1
        head = torch.tensor([_P2P_MAGIC, t.numel() * t.element_size(), dt, t.numel()], dtype=torch.int64)
        payload = data.reshape(-1).view(torch.uint8)
        works = [self._transport.send([head], dst_rank, tag)]
        if payload.numel():
            works.append(self._transport.send([payload], dst_rank, tag))

        def finish():
            for w in works:
                w.wait()
            return self._rank

        return _P2PWork(finish, [t])

    def recv(self, tensors, src_rank, tag=0):
        return self._recv(tensors, src_rank, tag)

    def recv_anysource(self, tensors, tag=0):
        return self._recv(tensors, None, tag)

    def _recv(self, tensors, src_rank, tag):
        (t,) = check_tensors(tensors)
        fired = self._p2p_defects("recv", t)
        head = torch.empty(_P2P_HEADER, dtype=torch.int64)
        hw = (self._transport.recv([head], src_rank, tag) if src_rank is not None
              else self._transport.recv_anysource([head], tag))

        def finish():
            hw.wait()
            src = src_rank if src_rank is not None else hw._source_rank()
            magic, nbytes, dt, count = head.tolist()
            buf = torch.empty(nbytes, dtype=torch.uint8)
            if nbytes:
                self._transport.recv([buf], src, tag).wait()
            if magic != _P2P_MAGIC:
                raise RuntimeError(f"neuron c10d::recv: a corrupt message from rank {src}")
            want = _DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1
            if dt != want or count != t.numel() or nbytes != t.numel() * t.element_size():
                sent = dtype_name(_DTYPES[dt]) if 0 <= dt < len(_DTYPES) else "?"
                raise RuntimeError(f"neuron c10d::recv: rank {src} sent {count} {sent} elements but the receive "
                                   f"tensor is {fmt(spec(t))}; sizes and dtypes must match")
            res = buf.view(t.dtype).reshape(t.shape).clone() if nbytes else torch.empty(t.shape, dtype=t.dtype)
            self._perturb(fired, [res])
            write_back(t, res)
            return src

        return _P2PWork(finish, [t])
