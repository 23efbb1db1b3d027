"""Training parity of FSDP2 and tensor parallelism on a target's device and c10d backend.

A tiny Llama-style model (:class:`Llama`: token embedding, two blocks of RMSNorm, attention with
rotary embeddings and SwiGLU feed-forward, final RMSNorm, output projection; dim 32, 4 heads,
vocabulary 64, sequence 16, batch 4, float32; seeded weights and data) is trained ``steps`` steps
with SGD (lr :data:`LR`, no momentum: a wrong gradient shows in the next parameters, where AdamW's
first step would normalise it away):

- on the target: ``world_size`` rank processes (``python -m conformance.dist.training --rank``)
  in the target's process group (``t.dist_backend()``, FileStore rendezvous in a temp dir), on its
  device. ``fsdp2``: ``fully_shard`` on every block, then the root, on a 1-D device mesh; each rank
  trains on its ``BATCH / world_size`` rows (FSDP2 averages gradients by reduce-scatter), a step's
  loss is the ranks' mean. ``tp``: ``parallelize_module`` with ColwiseParallel on wq, wk, wv, w1,
  w3 and RowwiseParallel on wo, w2, the embedding RowwiseParallel (its output all-reduced), the
  output ColwiseParallel (logits replicated); every rank takes the whole batch;
- the reference: the same model, data and optimizer without parallelism, on the CPU in this
  process (``reference="cpu"``, the default), or (``"device"``) on the target's device in one more
  process: that isolates sharding and collectives from the device's own op numerics.

After every step the ranks gather every parameter (``DTensor.full_tensor()``) and rank 0 hands
them back. Step ``k`` (from 1) compares its loss, then every parameter after it, in model order;
the first outside :data:`TOLERANCE` is ``first_divergence`` (with its error as ``max_rel_err``):
the loss by ``|l - l_ref| / max(|l_ref|, 1) <= loss_rtol``, a parameter by ``||p - p_ref|| /
max(||p_ref - p_0||, floor) <= param_rtol`` (L2; ``p_0`` the initial weights; ``floor``
:data:`PARAM_FLOOR` of the step's largest ``||p_ref - p_0||``) -- measured against how far
training moved it, not its value: a step moves a weight by 0.1 % to a few % of its size, and
element-wise rtol 1e-4 / atol 1e-5 on the values missed TP's 1 % all-reduce defect below.

Measured (3 steps; largest over steps and parameters) against the CPU: ``ideal`` loss 1.1e-7,
parameters 6.5e-6 (world size 2; 8.3e-6 at 4; the cpu target over gloo alike). A 1 %
``wrong_result`` on the collective carrying each mode's gradients (FSDP2
``c10d::reduce_scatter_tensor``, TP ``c10d::all_reduce``) puts 1.0e-2 on the parameters from step
1 and <= 7e-6 on the loss (TP's 1 % on activations feeds RMSNorms, which divide it out). Hence
``param_rtol`` 1e-3 (120x above ideal, 10x below the defect) and ``loss_rtol`` 1e-5 (90x above
ideal). Build 2.33.0 (bf16 matmul inputs from 2.31.0, 16-bit transcendentals) is 7.2e-5 / 6.7e-3
from the CPU -- a mismatch no bound can accept while still seeing a 1 % collective error -- but
0 / 9.7e-5 (TP) and 5.5e-8 / 3.0e-6 (FSDP2) from the device alone, the same defects 1.1e-2 there.
With the target's errors surfaced 2.33.0 stops earlier: its ``channels_last = "error"`` rule
refuses a permuted gradient SDPA's backward hands the rotary embedding (run it as a user does with
``env=("NEURON_EMU_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=0",)``).

Statuses: ``pass``, ``mismatch``, ``error`` (a process raised, or a size ``world_size`` does not
divide), ``crash`` (a process died without a result), ``timeout`` (not all done in ``timeout_s``:
all killed); every process started dies with its parent. ``python -m conformance.dist.training
--target neuron-emu --build 2.33.0 --mode fsdp2`` prints the result as JSON.

    >>> [n for n, _ in make_model().named_parameters()][:3]   # the order divergences are looked for in
    ['tok_embeddings.weight', 'layers.0.attention_norm.weight', 'layers.0.attention.wq.weight']
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the usual name
from torch import nn

DIM, HEADS, VOCAB, SEQ, BATCH, LAYERS = 32, 4, 64, 16, 4, 2
HIDDEN = 96          # SwiGLU width: Llama's int(2 * 4 * DIM / 3) rounded up to a multiple of 32
ROPE_THETA = 10000.0
NORM_EPS = 1e-5
LR = 0.1
MODEL_SEED, DATA_SEED = 1234, 4321
MODES = ("fsdp2", "tp")
REFERENCES = ("cpu", "device")
#: The parity bounds (see the module doc for what they bound, what was measured and the margins).
TOLERANCE = {"loss_rtol": 1e-5, "param_rtol": 1e-3}
PARAM_FLOOR = 1e-3   # a parameter's displacement is floored at this fraction of the step's largest
GRACE_S = 5.0        # how long the other processes may finish after one failed, before they are killed
PG_SLACK_S = 60.0    # the process group's own timeout is this much longer: a hang is the parent's timeout


# ----------------------------------------------------------------------------------- the model
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = NORM_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` (batch, seq, heads, head_dim): each (even, odd) pair of a
    head's features rotated by position x frequency (Llama's interleaved form, in real arithmetic)."""
    hd = x.shape[-1]
    freqs = 1.0 / (ROPE_THETA ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    angles = torch.outer(torch.arange(x.shape[1], device=x.device, dtype=torch.float32), freqs)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: a tensor-parallel rank holds HEADS / world of them (column-sharded wq, wk, wv)
        q, k, v = (w(x).view(b, s, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = rotary(q), rotary(k)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shapes = ((DIM, HIDDEN), (HIDDEN, DIM), (DIM, HIDDEN))
        self.w1, self.w2, self.w3 = (nn.Linear(i, o, bias=False) for i, o in shapes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(DIM), Attention()
        self.ffn_norm, self.feed_forward = RMSNorm(DIM), FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def make_model() -> Llama:
    """The model on the CPU with its seeded weights (its own generator: the same in every
    process, whatever else drew from the global one): embedding N(0, 1), linear U(+-1/sqrt(fan_in))
    as nn.Linear's default, norms 1."""
    model = Llama()
    g = torch.Generator().manual_seed(MODEL_SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name == "tok_embeddings.weight":
                p.normal_(0.0, 1.0, generator=g)
            else:
                bound = 1.0 / math.sqrt(p.shape[1])
                p.uniform_(-bound, bound, generator=g)
    return model


def make_data(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded token batches: inputs and next-token targets, (steps, BATCH, SEQ) each."""
    g = torch.Generator().manual_seed(DATA_SEED)
    tokens = torch.randint(0, VOCAB, (steps, BATCH, SEQ + 1), generator=g)
    return tokens[..., :-1].contiguous(), tokens[..., 1:].contiguous()


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1))


def train(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, steps: int, device: str,
          snapshot, foreach: bool | None = None) -> tuple[list[float], list[Any]]:
    """``steps`` SGD steps; each step's loss and ``snapshot(model)`` after it."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=foreach)
    losses, snaps = [], []
    for k in range(steps):
        loss = loss_fn(model(inputs[k].to(device)), targets[k].to(device))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach().cpu()))
        snaps.append(snapshot(model))
    return losses, snaps


def _local_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters()}


def cpu_reference(steps: int) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    """The single-process CPU run: each step's loss and every parameter after it."""
    inputs, targets = make_data(steps)
    return train(make_model(), inputs, targets, steps, "cpu", _local_params)


def size_problem(mode: str, world_size: int) -> str | None:
    """Why ``mode`` cannot run on ``world_size`` ranks (None: it can)."""
    if mode not in MODES:
        return f"mode {mode!r}: one of {', '.join(MODES)}"
    if world_size < 1:
        return f"world size {world_size}: at least 1"
    if mode == "fsdp2" and BATCH % world_size:
        return f"fsdp2 splits the batch of {BATCH} over the ranks: world size {world_size} does not divide it"
    if mode == "tp" and any(n % world_size for n in (HEADS, HIDDEN, VOCAB)):
        return (f"tp shards {HEADS} heads, the feed-forward width {HIDDEN} and the vocabulary {VOCAB}: "
                f"world size {world_size} does not divide them all")
    return None


# ----------------------------------------------------------------------------------- one rank
def parallelize(model: nn.Module, mode: str, mesh) -> nn.Module:
    if mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)   # moves the CPU-built parameters to the mesh's device
        return model
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model.to(mesh.device_type)
    plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(), "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(), "feed_forward.w2": RowwiseParallel()}
    for block in model.layers:
        parallelize_module(block, mesh, plan)
    parallelize_module(model, mesh, {"tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
                                     "output": ColwiseParallel(output_layouts=Replicate())})
    return model


def gather_params(model: nn.Module, keep: bool) -> dict[str, torch.Tensor] | None:
    """Every parameter as a full CPU tensor (a collective for DTensors: every rank calls it);
    kept where ``keep`` (rank 0)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        if keep:
            out[name] = full.detach().cpu().clone()
    return out if keep else None


def _setup_target(target_name: str, build: str | None) -> Any:
    from conformance.targets import get_target

    target = get_target(target_name, build)
    target.setup()
    return target


def run_rank(rank: int, world: int, target_name: str, build: str | None, mode: str, steps: int,
             store_path: str, timeout_s: float) -> dict[str, Any]:
    """One rank's training: its losses (and rank 0's parameter snapshots)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    target = _setup_target(target_name, build)
    backend = target.dist_backend()
    if backend is None:
        raise RuntimeError(f"target {target_name} has no torch.distributed backend for device {target.device!r}")
    dist.init_process_group(backend, store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        device = torch.device(target.device).type
        mesh = init_device_mesh(device, (world,))
        model = parallelize(make_model(), mode, mesh)
        inputs, targets = make_data(steps)
        if mode == "fsdp2":   # data parallel: this rank's rows of every batch
            n = BATCH // world
            inputs, targets = inputs[:, rank * n:(rank + 1) * n], targets[:, rank * n:(rank + 1) * n]
        # tp leaves the norms plain tensors beside DTensor weights, and SGD's foreach kernels refuse
        # the mix ("got mixed torch.Tensor and DTensor"): the per-parameter loop, the CPU's default
        foreach = False if mode == "tp" else None
        losses, snaps = train(model, inputs, targets, steps, device, lambda m: gather_params(m, rank == 0), foreach)
        target.synchronize()
        return {"losses": losses, "params": snaps if rank == 0 else None, "build": target.build, "backend": backend}
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def run_alone(target_name: str, build: str | None, steps: int) -> dict[str, Any]:
    """The reference on the target's device: the model trained in one process, no parallelism."""
    target = _setup_target(target_name, build)
    device = torch.device(target.device).type
    inputs, targets = make_data(steps)
    losses, snaps = train(make_model().to(device), inputs, targets, steps, device, _local_params)
    target.synchronize()
    return {"losses": losses, "params": snaps, "build": target.build}


def child_main(args: argparse.Namespace) -> None:
    """A rank (``--rank``) or the device reference (``--alone``): its result or error into ``args.out``."""
    from conformance.run.isolation import die_with

    # the parent's pid from the command line: one that died while this one imported is noticed
    die_with(args.parent or os.getppid(), args.parent or os.getppid())
    torch.set_num_threads(1)
    who = "the device reference" if args.alone else f"rank {args.rank}"
    try:
        result = (run_alone(args.target, args.build, args.steps) if args.alone else
                  run_rank(args.rank, args.world_size, args.target, args.build, args.mode, args.steps, args.store,
                           args.timeout))
    except Exception as exc:  # noqa: BLE001 - the process's failure is its result
        result = {"error": f"{who}: {describe(exc)}", "traceback": traceback.format_exc()[-4000:]}
    torch.save(result, args.out + ".tmp")
    os.replace(args.out + ".tmp", args.out)   # whole or absent


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"[:500]


# ---------------------------------------------------------------------------------- comparing
def _norm(t: torch.Tensor) -> float:
    n = float(t.double().norm())
    return n if math.isfinite(n) else math.inf


def loss_err(got: float, want: float) -> float:
    """``|got - want| / max(|want|, 1)``; inf where one is not finite (both NaN: 0)."""
    if math.isnan(got) and math.isnan(want):
        return 0.0
    if not (math.isfinite(got) and math.isfinite(want)):
        return math.inf
    return abs(got - want) / max(abs(want), 1.0)


def param_errs(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
               init: dict[str, torch.Tensor]) -> dict[str, float]:
    """Each parameter's ``||got - want|| / max(||want - init||, floor)``, in model order (inf for a
    missing or misshaped one, or a non-finite difference).

    >>> init, want = {"w": torch.zeros(4)}, {"w": torch.ones(4)}
    >>> round(param_errs({"w": torch.full((4,), 1.01)}, want, init)["w"], 6)
    0.01
    """
    moved = {n: _norm(w - init[n]) for n, w in want.items()}
    floor = PARAM_FLOOR * max((m for m in moved.values() if math.isfinite(m)), default=0.0)
    out = {}
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape:
            out[name] = math.inf
            continue
        num, den = _norm(g - w), max(moved[name], floor)
        out[name] = num / den if den > 0 else (0.0 if num == 0 else math.inf)
    return out


def compare(dev_losses: list[float], dev_params: list[dict[str, torch.Tensor]], ref_losses: list[float],
            ref_params: list[dict[str, torch.Tensor]], tol: dict[str, float] = TOLERANCE) -> tuple[dict | None, dict]:
    """The first divergence -- ``{"step" (from 1), "what" ("loss" or a parameter name, model
    order), "max_rel_err"}`` -- or None; and the largest errors seen (``{"loss", "params"}``)."""
    init = {n: p.detach() for n, p in make_model().named_parameters()}
    first, worst = None, {"loss": 0.0, "params": 0.0}
    for k, (dl, rl) in enumerate(zip(dev_losses, ref_losses, strict=True)):
        err = loss_err(dl, rl)
        worst["loss"] = max(worst["loss"], err)
        if first is None and not err <= tol["loss_rtol"]:
            first = {"step": k + 1, "what": "loss", "max_rel_err": err}
        for name, err in param_errs(dev_params[k], ref_params[k], init).items():
            worst["params"] = max(worst["params"], err)
            if first is None and not err <= tol["param_rtol"]:
                first = {"step": k + 1, "what": name, "max_rel_err": err}
    return first, worst


# ----------------------------------------------------------------------------------- the parent
def train_parity(target: str, build: str | None, mode: str, world_size: int = 2, steps: int = 3,
                 timeout_s: float = 120, *, reference: str = "cpu", env: tuple[str, ...] = ()) -> dict[str, Any]:
    """Trains the model ``steps`` steps on ``target`` (``build``: a name or a manifest path;
    None: the target's default) with ``mode`` over ``world_size`` ranks, and compares it with the
    ``reference`` run (see the module doc). ``env``: ``NAME=VALUE`` pairs set in every process
    started (e.g. the device's recovery switch)."""
    t0 = time.monotonic()
    result: dict[str, Any] = {"status": "error", "mode": mode, "world_size": world_size, "steps": steps,
                              "target": target, "build": build, "reference": reference, "optimizer": f"SGD(lr={LR})",
                              "tolerance": dict(TOLERANCE), "losses": {"device": [], "cpu": []},
                              "first_divergence": None, "max_rel_err": None, "error": None}

    def done(status: str, error: str | None = None) -> dict[str, Any]:
        result.update(status=status, error=error, wall_s=round(time.monotonic() - t0, 3))
        return result

    bad_env = [p for p in env if not p.partition("=")[0] or not p.partition("=")[1]]
    problem = (size_problem(mode, world_size) or (None if steps >= 1 else f"steps {steps}: at least 1")
               or (None if reference in REFERENCES else f"reference {reference!r}: one of {', '.join(REFERENCES)}")
               or (f"env {bad_env[0]!r}: expected NAME=VALUE" if bad_env else None))
    if problem:
        return done("error", problem)
    if build is not None and build.endswith(".toml"):
        build = str(Path(build).resolve())
    with tempfile.TemporaryDirectory(prefix="dist-train-") as tmp:
        procs = _spawn(Path(tmp), target, build, mode, world_size, steps, timeout_s, reference == "device", env)
        status, error, outs = _wait(procs, t0 + timeout_s, timeout_s)
        if status != "ok":
            return done(status, error)
    result["build"], result["backend"] = outs[0].get("build", build), outs[0].get("backend")
    per_rank = [o["losses"] for o in outs[:world_size]]
    dev_losses = [sum(ls) / len(ls) for ls in zip(*per_rank, strict=True)] if mode == "fsdp2" else per_rank[0]
    dev_params = outs[0]["params"]
    cpu_losses, cpu_params = cpu_reference(steps)
    result["losses"] = {"device": dev_losses, "cpu": cpu_losses}
    ref_losses, ref_params = cpu_losses, cpu_params
    if reference == "device":
        ref_losses, ref_params = outs[world_size]["losses"], outs[world_size]["params"]
        result["losses"]["device_alone"] = ref_losses
        result["max_rel_err_cpu"] = compare(dev_losses, dev_params, cpu_losses, cpu_params)[1]
    first, worst = compare(dev_losses, dev_params, ref_losses, ref_params)
    result["first_divergence"], result["max_rel_err"] = first, worst
    return done("pass" if first is None else "mismatch")


_Proc = collections.namedtuple("_Proc", "name proc out log")   # a started process, its result and output files


def _spawn(tmp: Path, target: str, build: str | None, mode: str, world: int, steps: int, timeout_s: float,
           alone: bool, env_pairs: tuple[str, ...]) -> list[_Proc]:
    """The ranks, and the device reference where ``alone``: fresh interpreters that die with this one."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env.update(p.split("=", 1) for p in env_pairs)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    common = [sys.executable, "-m", "conformance.dist.training", "--target", target, "--build", build or "",
              "--mode", mode, "--world-size", str(world), "--steps", str(steps), "--parent", str(os.getpid())]
    jobs = [(f"rank {r}", ["--rank", str(r), "--store", str(tmp / "store"), "--timeout", str(timeout_s + PG_SLACK_S)])
            for r in range(world)]
    if alone:
        jobs.append(("the device reference", ["--alone"]))
    procs = []
    for i, (name, extra) in enumerate(jobs):
        out, log = tmp / f"proc{i}.pt", tmp / f"proc{i}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen([*common, *extra, "--out", str(out)], cwd=root, env=env,
                                    stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT)
        procs.append(_Proc(name, proc, out, log))
    return procs


def _kill(procs: list[_Proc]) -> None:
    for p in [p for p in procs if p.proc.poll() is None]:
        p.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.proc.wait(10)


def _failed(p: _Proc) -> bool:
    code = p.proc.poll()
    return code is not None and (code != 0 or not p.out.exists() or "error" in _load(p.out))


def _wait(procs: list[_Proc], deadline: float, timeout_s: float) -> tuple[str, str | None, list[dict]]:
    """Waits for every process: ("ok", None, their results) or a failing status and why. Once
    one failed the others get :data:`GRACE_S` (ranks may be blocked in a collective with it)."""
    failed_at = None
    try:
        while any(p.proc.poll() is None for p in procs):
            now = time.monotonic()
            if failed_at is None and any(_failed(p) for p in procs):
                failed_at = now
            if now >= deadline or (failed_at is not None and now - failed_at >= GRACE_S):
                break
            time.sleep(0.05)
    finally:
        alive = [p for p in procs if p.proc.poll() is None]
        _kill(procs)
    outs = [_load(p.out) for p in procs]
    dead = [p for p, o in zip(procs, outs, strict=True) if not o and p not in alive]
    if dead:
        code = dead[0].proc.returncode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        last = _tail(dead[0].log)
        return "crash", f"{dead[0].name} died ({how})" + (f": {last}" if last else ""), outs
    errors = [o["error"] for o in outs if "error" in o]
    if errors:
        return "error", errors[0], outs
    if alive:
        return "timeout", f"{', '.join(p.name for p in alive)} did not finish within {timeout_s:g} s", outs
    return "ok", None, outs


def _tail(path: Path) -> str:
    """The last line of a process's output."""
    lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return lines[-1][-300:] if lines else ""


def _load(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, weights_only=True) if path.exists() else {}
    except Exception:  # noqa: BLE001 - a torn file reads as no result
        return {}


# --------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.dist.training",
                                 description="Training parity of FSDP2 / tensor parallelism on a target (JSON out).")
    ap.add_argument("--target", default="neuron-emu")
    ap.add_argument("--build", default=None, help="a build name or a manifest .toml (default: the target's)")
    ap.add_argument("--mode", choices=MODES, default="fsdp2")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for the ranks, start to finish")
    ap.add_argument("--reference", choices=REFERENCES, default="cpu",
                    help="compare with the model trained on the CPU (default) or on the target's device, alone")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="set in every process started (repeatable)")
    # the processes the parent starts
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--alone", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--parent", type=int, default=None, help=argparse.SUPPRESS)
    for hidden in ("--store", "--out"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.build = args.build or None
    if args.rank is not None or args.alone:
        child_main(args)
        return 0
    result = train_parity(args.target, args.build, args.mode, args.world_size, args.steps, args.timeout,
                          reference=args.reference, env=tuple(args.env))
    print(json.dumps(result, indent=2))
    return 0 if result["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
