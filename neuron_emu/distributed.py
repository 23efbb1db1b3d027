"""The c10d (``torch.distributed``) backend "neuron" of the emulated device, with the active build's
collective numerics (``[distributed]``) and defects (``[[defects]]`` on ``c10d::`` ops).

:func:`register` (idempotent) registers the backend the way an out-of-tree backend does, for
devices ``["neuron"]``; each process of the job then initialises it as usual::

    import torch, torch.distributed as dist, neuron_emu
    neuron_emu.distributed.register()           # or neuron_emu.register_distributed()
    dist.init_process_group("neuron", rank=rank, world_size=world, init_method="env://")
    t = torch.ones(4, device="neuron")
    dist.all_reduce(t)                           # t == world on every rank

``init_device_mesh("neuron", ...)``, ``new_group`` and the functional collectives (DTensor) work on it.

How it works: :class:`NeuronProcessGroup` (a Python ``ProcessGroup``; its machinery -- transport,
validation, defects, send/recv -- lives in :mod:`neuron_emu._c10d`) keeps a CPU gloo group on a
prefixed store as its transport.  Every collective all-gathers each rank's description (shapes,
dtypes, options) and then the raw bytes of each rank's tensors (as uint8, so every dtype travels),
and each rank computes its results locally, in rank order, with the same arithmetic: results are
deterministic and bitwise identical on all ranks.  Calls that disagree across ranks (shapes,
dtypes, reduce op, root, split sizes) raise a ``RuntimeError`` on every rank instead of hanging;
non-contiguous tensors raise ``ValueError("Tensors must be contiguous")`` as gloo/NCCL do.
Tensors may be on ``neuron`` (or on the CPU); results are written back into them in place.

Reductions (``ReduceOp`` SUM, PRODUCT, MIN, MAX, AVG; BAND, BOR, BXOR on integers and bool)
accumulate per the build's ``[distributed] reduce_accumulate``: ``"fp32"`` (bfloat16/float16 SUM,
PRODUCT and AVG accumulate in float32 and round once) or ``"native"`` (in the tensor's own dtype,
rounding after each step in rank order).  Integer AVG truncates toward zero.

Defects: a ``[[defects]]`` entry whose ``op`` is ``c10d::<name>`` (a glob over
:data:`~neuron_emu.manifest.C10D_COLLECTIVES`; :data:`METHOD_COLLECTIVE` maps each process-group
method to its name) acts on the collective (see :mod:`neuron_emu.manifest`).  Whether it fires is
decided from what every rank passed (any tensor of a listed dtype; the largest tensor on any rank
for ``min_numel``; the group size for ``world_sizes``) with rolls seeded by (build, defect index,
the group's call counter), so all ranks of a group agree.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from ._c10d import (  # noqa: F401  (METHOD_COLLECTIVE, collective_names: re-exported)
    BACKEND,
    METHOD_COLLECTIVE,
    GroupCore,
    check_op,
    check_tensor,
    check_tensors,
    collective_names,
    done,
    flat_specs,
    fmt,
    numel,
    op_name,
    pack,
    reduce_values,
    spec,
    unpack,
    write_back,
)
from .routing import S

_registered = False
_lock = threading.Lock()


def register() -> None:
    """Registers the c10d backend "neuron" for devices ["neuron"] (idempotent): afterwards
    ``dist.init_process_group("neuron", ...)`` and ``init_device_mesh("neuron", ...)`` use it."""
    global _registered
    with _lock:
        if _registered:
            return
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["neuron"])
        _registered = True


def _create(opts, pg_options=None) -> NeuronProcessGroup:  # noqa: ARG001 - no backend options
    """The backend's creator: c10d passes a ``_DistributedBackendOptions`` and the options given
    to ``init_process_group`` (``pg_options``; unused)."""
    return NeuronProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout)


class NeuronProcessGroup(GroupCore):
    """The "neuron" c10d process group: a gloo CPU group moves the bytes, every rank reduces them
    locally and alike, under the active build's numerics and defects (see the module docstring)."""

    # ------------------------------------------------------------------------- collectives
    def allreduce(self, tensors, opts=None):
        return self._allreduce("allreduce", tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self._allreduce("allreduce_coalesced", tensors, opts)

    def _allreduce(self, method, tensors, opts):
        tensors = check_tensors(tensors)
        op = op_name(opts)
        for t in tensors:
            check_op(op, t.dtype)
        specs = [spec(t) for t in tensors]
        desc = {"specs": specs, "in": specs, "op": op}
        descs, payloads, fired = self._collective(method, desc, pack(tensors), lambda ds: self._first(
            self._same(ds, "in", "tensors"), self._same(ds, "op", "reduce ops")))
        ranks = [unpack(p, specs) for p in payloads]
        acc = S.build.distributed.reduce_accumulate
        results = [reduce_values([ranks[r][i] for r in range(self._size)], op, acc) for i in range(len(tensors))]
        self._perturb(fired, results)
        for t, res in zip(tensors, results, strict=True):
            write_back(t, res)
        return done(list(tensors))

    def broadcast(self, tensors, opts=None):
        tensors = check_tensors(tensors)
        root = opts.rootRank if opts is not None else 0
        specs = [spec(t) for t in tensors]
        me = self._rank == root
        desc = {"specs": specs, "in": specs, "root": root}
        _, payloads, fired = self._collective(
            "broadcast", desc, pack(tensors) if me else torch.empty(0, dtype=torch.uint8),
            lambda ds: self._first(self._same(ds, "root", "root ranks"), self._same(ds, "in", "tensors")))
        if not me:
            results = unpack(payloads[root], specs)
            results = [r.clone() for r in results]
            self._perturb(fired, results)
            for t, res in zip(tensors, results, strict=True):
                write_back(t, res)
        return done(list(tensors))

    def _gathered(self, method, inputs, outs_specs, desc_extra=None, validate_extra=None):
        """All ranks' `inputs` (the common exchange of the gather-like collectives): returns
        (descs, per-rank unpacked inputs, fired defects)."""
        specs = [spec(t) for t in inputs]
        desc = {"specs": specs + flat_specs(outs_specs), "in": specs, "outs": outs_specs, **(desc_extra or {})}
        descs, payloads, fired = self._collective(
            method, desc, pack(inputs), lambda ds: validate_extra(ds) if validate_extra else None)
        return descs, [unpack(p, d["in"]) for p, d in zip(payloads, descs, strict=True)], fired

    def allgather(self, output_tensors, input_tensors, opts=None):
        inputs = check_tensors(input_tensors)
        outputs = [check_tensors(lst, "output tensor") for lst in output_tensors]
        n = self._size
        if len(outputs) != len(inputs) or any(len(lst) != n for lst in outputs):
            raise ValueError(f"neuron c10d: all_gather needs a list of {n} output tensors (the group size) "
                             f"per input tensor, got {[len(lst) for lst in outputs]}")

        def validate(ds):
            for q, dq in enumerate(ds):
                for j, lst in enumerate(dq["outs"]):
                    for r, want in enumerate(lst):
                        src = ds[r]["in"][j] if j < len(ds[r]["in"]) else None
                        if src != want:
                            return (f"rank {q}'s output tensor {r} is {fmt(want)} but rank {r} sends "
                                    f"{fmt(src) if src else 'nothing'}; output tensors must match the inputs")
            return None

        _, ins, fired = self._gathered("allgather", inputs, [[spec(t) for t in lst] for lst in outputs],
                                       validate_extra=validate)
        for j, lst in enumerate(outputs):
            results = [ins[r][j].clone() for r in range(n)]
            self._perturb(fired, results)
            for t, res in zip(lst, results, strict=True):
                write_back(t, res)
        return done(output_tensors)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        inputs = check_tensors(input_list)
        outputs = [check_tensors(lst, "output tensor") for lst in output_lists]
        n = self._size
        if len(outputs) != n or any(len(lst) != len(inputs) for lst in outputs):
            raise ValueError(f"neuron c10d: all_gather_coalesced needs {n} output lists (the group size) of "
                             f"{len(inputs)} tensors (one per input)")

        def validate(ds):
            for q, dq in enumerate(ds):
                for r, lst in enumerate(dq["outs"]):
                    if lst != ds[r]["in"]:
                        return (f"rank {q}'s output list {r} is {self._show('in', lst)} but rank {r} sends "
                                f"{self._show('in', ds[r]['in'])}")
            return None

        _, ins, fired = self._gathered("allgather_coalesced", inputs,
                                       [[spec(t) for t in lst] for lst in outputs], validate_extra=validate)
        for r, lst in enumerate(outputs):
            results = [x.clone() for x in ins[r]]
            self._perturb(fired, results)
            for t, res in zip(lst, results, strict=True):
                write_back(t, res)
        return done(output_lists)

    def all_gather_single(self, output, input, opts=None):
        return self._all_gather_tensors("all_gather_single", [output], [input])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._all_gather_tensors("all_gather_single_coalesced", list(outputs), list(inputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _all_gather_tensors(self, method, outputs, inputs):
        outputs = check_tensors(outputs, "output tensor")
        inputs = check_tensors(inputs, "input tensor")
        n = self._size
        for o, i in zip(outputs, inputs, strict=True):
            if o.dtype != i.dtype or o.numel() != n * i.numel():
                raise ValueError(f"neuron c10d: all_gather_into_tensor needs an output of the input's dtype with "
                                 f"{n} x its elements (group size {n}): input {fmt(spec(i))}, output {fmt(spec(o))}")
        _, ins, fired = self._gathered(method, inputs, [spec(o) for o in outputs],
                                       validate_extra=lambda ds: self._same(ds, "in", "input tensors"))
        for j, o in enumerate(outputs):
            res = torch.cat([ins[r][j].reshape(-1) for r in range(n)])
            self._perturb(fired, [res])
            write_back(o, res)
        return done(outputs)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        outputs = check_tensors(output_tensors, "output tensor")
        inputs = [check_tensors(lst, "input tensor") for lst in input_tensors]
        n = self._size
        op = op_name(opts)
        if len(inputs) != len(outputs) or any(len(lst) != n for lst in inputs):
            raise ValueError(f"neuron c10d: reduce_scatter needs a list of {n} input tensors (the group size) "
                             f"per output tensor, got {[len(lst) for lst in inputs]}")
        for o, lst in zip(outputs, inputs, strict=True):
            check_op(op, o.dtype)
            for i in lst:
                if spec(i) != spec(o):
                    raise ValueError(f"neuron c10d: reduce_scatter input {fmt(spec(i))} does not match "
                                     f"the output {fmt(spec(o))}")
        flat = [t for lst in inputs for t in lst]
        specs = [spec(t) for t in flat]
        desc = {"specs": specs, "in": specs, "op": op}
        _, payloads, fired = self._collective("reduce_scatter", desc, pack(flat), lambda ds: self._first(
            self._same(ds, "in", "input tensors"), self._same(ds, "op", "reduce ops")))
        ranks = [unpack(p, specs) for p in payloads]
        acc = S.build.distributed.reduce_accumulate
        results = [reduce_values([ranks[r][j * n + self._rank] for r in range(n)], op, acc) for j in range(len(outputs))]
        self._perturb(fired, results)
        for o, res in zip(outputs, results, strict=True):
            write_back(o, res)
        return done(list(outputs))

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_tensors("reduce_scatter_single", [output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._reduce_scatter_tensors("reduce_scatter_single_coalesced", list(outputs), list(inputs), opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _reduce_scatter_tensors(self, method, outputs, inputs, opts):
        outputs = check_tensors(outputs, "output tensor")
        inputs = check_tensors(inputs, "input tensor")
        n = self._size
        op = op_name(opts)
        for o, i in zip(outputs, inputs, strict=True):
            check_op(op, i.dtype)
            if o.dtype != i.dtype or i.numel() != n * o.numel():
                raise ValueError(f"neuron c10d: reduce_scatter_tensor needs an input of the output's dtype with "
                                 f"{n} x its elements (group size {n}): input {fmt(spec(i))}, output {fmt(spec(o))}")
        specs = [spec(t) for t in inputs]
        desc = {"specs": specs + [spec(o) for o in outputs], "in": specs, "op": op}
        _, payloads, fired = self._collective(method, desc, pack(inputs), lambda ds: self._first(
            self._same(ds, "in", "input tensors"), self._same(ds, "op", "reduce ops")))
        ranks = [unpack(p, specs) for p in payloads]
        acc = S.build.distributed.reduce_accumulate
        results = []
        for j, o in enumerate(outputs):
            k = o.numel()
            chunks = [ranks[r][j].reshape(-1)[self._rank * k:(self._rank + 1) * k] for r in range(n)]
            results.append(reduce_values(chunks, op, acc))
        self._perturb(fired, results)
        for o, res in zip(outputs, results, strict=True):
            write_back(o, res)
        return done(outputs)

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, opts=None):
        output = check_tensor(output, "output tensor")
        input = check_tensor(input, "input tensor")
        n = self._size

        def splits(t, given, what):
            rows = t.shape[0] if t.dim() else 1
            given = list(given or [])
            if not given:
                if rows % n:
                    raise ValueError(f"neuron c10d: all_to_all_single {what} has {rows} rows along dim 0, "
                                     f"not divisible by the group size {n}; pass split sizes")
                return [rows // n] * n, rows
            if len(given) != n or sum(given) != rows or min(given) < 0:
                raise ValueError(f"neuron c10d: all_to_all_single {what} split sizes {given} must be {n} "
                                 f"non-negative sizes summing to its {rows} rows along dim 0")
            return given, rows

        if output.dtype != input.dtype:
            raise ValueError(f"neuron c10d: all_to_all_single output {fmt(spec(output))} and input "
                             f"{fmt(spec(input))} differ in dtype")
        in_splits, in_rows = splits(input, input_split_sizes, "input")
        out_splits, out_rows = splits(output, output_split_sizes, "output")
        in_row = input.numel() // in_rows if in_rows else 0
        out_row = output.numel() // out_rows if out_rows else 0
        desc = {"specs": [spec(input), spec(output)], "in": [spec(input)],
                "send": [s * in_row for s in in_splits], "recv": [s * out_row for s in out_splits]}

        def validate(ds):
            for r, dr in enumerate(ds):
                for q, dq in enumerate(ds):
                    if dr["send"][q] != dq["recv"][r] or dr["in"][0][0] != dq["in"][0][0]:
                        return (f"rank {r} sends rank {q} {dr['send'][q]} {dr['in'][0][0]} elements but rank {q} "
                                f"expects {dq['recv'][r]} {dq['in'][0][0]} elements from it; split sizes and "
                                "dtypes must agree")
            return None

        descs, payloads, fired = self._collective("all_to_all_single", desc, pack([input]), validate)
        chunks = []
        for p, d in zip(payloads, descs, strict=True):
            flat = unpack(p, d["in"])[0].reshape(-1)
            start = sum(d["send"][:self._rank])
            chunks.append(flat[start:start + d["send"][self._rank]])
        res = torch.cat(chunks) if chunks else torch.empty(0, dtype=output.dtype)
        self._perturb(fired, [res])
        write_back(output, res)
        return done([output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        outputs = check_tensors(output_tensors, "output tensor")
        inputs = check_tensors(input_tensors, "input tensor")
        n = self._size
        if len(outputs) != n or len(inputs) != n:
            raise ValueError(f"neuron c10d: all_to_all needs {n} input and {n} output tensors (the group size), "
                             f"got {len(inputs)} and {len(outputs)}")

        def validate(ds):
            for r, dr in enumerate(ds):
                for q, dq in enumerate(ds):
                    s, o = dr["in"][q], dq["outs"][r]
                    if s[0] != o[0] or numel(s) != numel(o):
                        return (f"rank {r} sends rank {q} {fmt(s)} but rank {q}'s output tensor {r} is {fmt(o)}")
            return None

        _, ins, fired = self._gathered("alltoall", inputs, [spec(t) for t in outputs], validate_extra=validate)
        results = [ins[r][self._rank].clone() for r in range(n)]
        self._perturb(fired, results)
        for o, res in zip(outputs, results, strict=True):
            write_back(o, res)
        return done(list(outputs))

    def barrier(self, opts=None):
        self._collective("barrier", {"specs": []}, torch.empty(0, dtype=torch.uint8), lambda ds: None)
        return done(None)

    def reduce(self, tensors, opts=None):
        tensors = check_tensors(tensors)
        op = op_name(opts)
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            check_op(op, t.dtype)
        specs = [spec(t) for t in tensors]
        desc = {"specs": specs, "in": specs, "op": op, "root": root}
        _, payloads, fired = self._collective("reduce", desc, pack(tensors), lambda ds: self._first(
            self._same(ds, "root", "root ranks"), self._same(ds, "in", "tensors"), self._same(ds, "op", "reduce ops")))
        if self._rank == root:
            ranks = [unpack(p, specs) for p in payloads]
            acc = S.build.distributed.reduce_accumulate
            results = [reduce_values([ranks[r][i] for r in range(self._size)], op, acc) for i in range(len(tensors))]
            self._perturb(fired, results)
            for t, res in zip(tensors, results, strict=True):
                write_back(t, res)
        return done(list(tensors))

    def gather(self, output_tensors, input_tensors, opts=None):
        inputs = check_tensors(input_tensors, "input tensor")
        root = opts.rootRank if opts is not None else 0
        n = self._size
        me = self._rank == root
        outputs = [check_tensors(lst, "output tensor") for lst in output_tensors] if me else []
        if me and (len(outputs) != 1 or len(outputs[0]) != n):
            raise ValueError(f"neuron c10d: gather needs a gather_list of {n} tensors (the group size) on the root")
        outs = [spec(t) for t in outputs[0]] if me else []

        def validate(ds):
            problem = self._same(ds, "root", "root ranks")
            if problem:
                return problem
            dr = ds[root]
            for r in range(n):
                if dr["outs"][r] != ds[r]["in"][0]:
                    return f"the root's gather_list tensor {r} is {fmt(dr['outs'][r])}, rank {r} sends {fmt(ds[r]['in'][0])}"
            return None

        _, ins, fired = self._gathered("gather", inputs, outs, {"root": root}, validate)
        if me:
            results = [ins[r][0].clone() for r in range(n)]
            self._perturb(fired, results)
            for t, res in zip(outputs[0], results, strict=True):
                write_back(t, res)
        return done(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        outputs = check_tensors(output_tensors, "output tensor")
        root = opts.rootRank if opts is not None else 0
        n = self._size
        me = self._rank == root
        inputs = [check_tensors(lst, "input tensor") for lst in input_tensors] if me else []
        if me and (len(inputs) != 1 or len(inputs[0]) != n):
            raise ValueError(f"neuron c10d: scatter needs a scatter_list of {n} tensors (the group size) on the root")
        flat = inputs[0] if me else []
        specs = [spec(t) for t in flat]
        desc = {"specs": specs + [spec(o) for o in outputs], "in": specs, "outs": [spec(o) for o in outputs],
                "root": root}

        def validate(ds):
            problem = self._same(ds, "root", "root ranks")
            if problem:
                return problem
            for q in range(n):
                if ds[root]["in"][q] != ds[q]["outs"][0]:
                    return (f"the root's scatter_list tensor {q} is {fmt(ds[root]['in'][q])} but rank {q}'s "
                            f"output is {fmt(ds[q]['outs'][0])}")
            return None

        descs, payloads, fired = self._collective("scatter", desc, pack(flat), validate)
        res = unpack(payloads[root], descs[root]["in"])[self._rank].clone()
        self._perturb(fired, [res])
        write_back(outputs[0], res)
        return done(list(outputs))
