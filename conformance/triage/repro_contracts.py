"""The part of a repro script appended when the stored item failed contracts.

First what torch calls alone show of the finding, without any harness code: for the layout
contracts an output whose strides differ from the CPU's and from the meta kernels' prediction,
or one the device's own elementwise ops reject (metadata), or inputs in another
layout (non-contiguous, channels_last) that the device rejects or computes differently from the
CPU on that layout (noncontiguous); for the variants contract an in-place, out=, method or alias
variant that differs from the function on the device where the CPU's agree. Each is printed as a
``STANDALONE:`` line (``tools/findings_repro.py`` counts it as reproduced). Then the item evaluated
as the sweep evaluates it, with the harness's own contracts (``CONTRACT FAILED:`` lines).

The text runs inside the script of :mod:`conformance.triage.repro` and uses its names (``call``,
``move``, ``leaves``, ``to_cpu``, ``data``, ``fn``, ``fn_functional``, ``info``, ``cpu``, ``dev``,
``ref``, ``target_fn``, ``ATOL``, ``RTOL``, ``RECORD``, ``DEVICE``, ``VARIANT``, ``failing``).
"""

CONTRACTS_PART = '''

# -- torch alone: what a layout or variant contract's finding looks like without harness code --
def strides(t):
    """The memory layout that matters: strides of the dimensions longer than 1, the offset."""
    return [s for s, n in zip(t.stride(), t.shape) if n > 1], t.storage_offset()


def metadata_difference():
    """An output whose memory layout differs from the CPU's and from what PyTorch's meta kernels
    predict for it, or one in a non-contiguous layout that the target's own elementwise ops reject
    (one the CPU runs on its own output), or None."""
    got = call(target_fn, DEVICE, ref, RECORD["sized_out"])
    mine = [t for t in leaves(cpu) if isinstance(t, torch.Tensor)]
    theirs = [t for t in leaves(got) if isinstance(t, torch.Tensor)]
    if VARIANT in ("function", "reference", "inplace"):
        try:
            meta = [t for t in leaves(call(fn, "meta")) if isinstance(t, torch.Tensor)]
        except Exception:
            meta = []
        for i, (x, y) in enumerate(zip(theirs, mine)):
            if (x.layout != torch.strided or y.layout != torch.strided or x.shape != y.shape or x.numel() < 2
                    or strides(x) == strides(y) or (i < len(meta) and strides(meta[i]) == strides(x))):
                continue
            return (f"output {i} of shape {list(x.shape)}: strides {list(x.stride())} (offset {x.storage_offset()}) "
                    f"on the target, {list(y.stride())} (offset {y.storage_offset()}) on the CPU"
                    + (f", {list(meta[i].stride())} from the meta kernels" if i < len(meta) else ""))
    for i, x in enumerate(theirs):
        if x.layout != torch.strided or x.numel() < 2 or x.is_contiguous() or i >= len(mine):
            continue
        for probe in (torch.eq, torch.mul):
            try:
                probe(mine[i], mine[i])
            except Exception:
                continue
            try:
                probe(x, x)
            except Exception as exc:
                return (f"output {i} (strides {list(x.stride())}) is rejected by the target's own "
                        f"torch.{probe.__name__}: {type(exc).__name__}: {str(exc).strip()[:300]}")
            break
    return None


def relaid(x, layout, device):
    """``x``'s tensors on ``device`` in ``layout``: "channels_last" (4-d tensors with channels and
    a plane), or "non-contiguous" (every other element of a buffer, the gaps NaN or the largest value)."""
    if isinstance(x, (list, tuple)):
        return type(x)(relaid(v, layout, device) for v in x)
    if isinstance(x, dict):
        return {k: relaid(v, layout, device) for k, v in x.items()}
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided:
        return move(x, device)
    t = x.detach()
    if layout == "channels_last":
        moved = t.to(device, copy=True)
        wide = t.dim() == 4 and t.shape[1] > 1 and t.shape[2] * t.shape[3] > 1
        return moved.contiguous(memory_format=torch.channels_last) if wide else moved
    if t.numel() < 2:
        return t.to(device, copy=True)
    gap = float("nan") if t.dtype.is_floating_point or t.dtype.is_complex else (
        True if t.dtype == torch.bool else torch.iinfo(t.dtype).max)
    big = torch.full((t.numel() * 3,), gap, dtype=t.dtype)
    big[:2 * t.numel():2].view(t.shape).copy_(t)
    return big.to(device)[:2 * t.numel():2].view(t.shape)


def layout_difference():
    """Inputs in another layout (non-contiguous, channels_last) that the target rejects or
    computes differently from the CPU on the same layout, beyond the item's tolerance, or None."""
    if VARIANT != "function" or data["input"] is None:
        return None
    for layout in ("non-contiguous", "channels_last"):
        try:
            inp, args, kwargs = relaid([data["input"], data["args"], data["kwargs"]], layout, "cpu")
            on_cpu = fn(inp, *args, **kwargs)
        except Exception:
            continue  # the CPU rejects the layout too: nothing to hold the target to
        inp, args, kwargs = relaid([data["input"], data["args"], data["kwargs"]], layout, DEVICE)
        try:
            on_target = to_cpu(target_fn(inp, *args, **kwargs))
        except Exception as exc:
            return (f"{layout} inputs: the target raises {type(exc).__name__}: {str(exc).strip()[:300]}; "
                    "the CPU accepts them")
        try:
            torch.testing.assert_close(on_target, on_cpu, atol=ATOL, rtol=RTOL, equal_nan=True, check_stride=False)
        except AssertionError as err:
            return f"{layout} inputs: the target's values differ from the CPU's on the same layout: " + \
                " ".join(str(err).split())[:300]
    return None


def plain(f, device):
    """``f`` on the sample on ``device``, called as the function variant is (no out=), copied to the CPU."""
    inp, args, kwargs = move([data["input"], data["args"], data["kwargs"]], device)
    return to_cpu(f(inp, *args, **kwargs))


def agree(a, b):
    """Two results of one device at torch's default tolerance for their dtype: "" or the difference."""
    try:
        torch.testing.assert_close(a, b, equal_nan=True, check_stride=False, check_dtype=False)
        return ""
    except AssertionError as err:
        return " ".join(str(err).split())[:300]


def variant_difference():
    """A variant (in-place, out=, the method, an alias) that differs from the function on the
    target where the CPU's variant and function agree, or None."""
    if data["input"] is None or VARIANT not in ("inplace", "out", "function"):
        return None
    if VARIANT in ("inplace", "out"):
        if agree(cpu, plain(fn_functional, "cpu")):
            return None  # the CPU's own variants disagree on this sample
        why = agree(dev, plain(fn_functional, DEVICE))
        return f"the {VARIANT} variant differs from the function on the target: {why}" if why else None
    others = [("method", getattr(info, "method_variant", None))] + [
        (f"alias {a.name}", a.op) for a in (getattr(info, "aliases", None) or ())]
    for label, f in others:
        if f is None or f is info.op:
            continue
        try:
            theirs = plain(f, "cpu")
        except Exception:
            continue
        if agree(theirs, cpu):
            continue
        try:
            why = agree(plain(f, DEVICE), dev)
        except Exception as exc:
            return f"the {label} raises on the target: {type(exc).__name__}: {str(exc).strip()[:300]}"
        if why:
            return f"the {label} differs from the function on the target: {why}"
    return None


for name, show in (("metadata", metadata_difference), ("noncontiguous", layout_difference),
                   ("variants", variant_difference)):
    if name in RECORD["contracts"]:
        try:
            shown = show()
        except Exception as exc:  # the torch-only check could not be made: the harness's below decides
            print(f"torch alone ({name}): not shown ({type(exc).__name__}: {exc})")
            shown = None
        if shown:
            print(f"STANDALONE: contract {name}: {shown}")
            failing = True

# -- the contracts the stored item failed, checked as the sweep checks them --------------------
from conformance.inputs.opinfo import samples
from conformance.sweep import SweepConfig, evaluate
from conformance.targets import get_target


def nth(it, n):
    for i, s in enumerate(it):
        if i == n:
            return s
    raise SystemExit(f"sample {n} no longer exists for this OpInfo (torch changed?)")


target = get_target(RECORD["target"], RECORD["build_spec"], tuple(RECORD["imports"]))
sample = nth(samples(info, getattr(torch, RECORD["dtype"]), thorough=RECORD["thorough"], seed=RECORD["seed"],
                     requires_grad=VARIANT == "backward", layout=VARIANT if VARIANT.startswith("sparse_") else None),
             RECORD["sample"])
config = SweepConfig(thorough=RECORD["thorough"], seed=RECORD["seed"], contracts=tuple(RECORD["contracts"]))
row = evaluate(target, info, RECORD["op"], VARIANT, RECORD["dtype"], RECORD["sample"], sample, config)
checks = row["contracts"] or {}
print(f"sweep status: {row['status']}")
for name in RECORD["contracts"]:
    check = checks.get(name)
    if check is None:
        print(f"contract {name}: not checked ({row['status']}: {row['error']})")
        failing = True
        continue
    print(f"contract {name}: {check['outcome']}" + (f": {check['detail']}" if check["detail"] else ""))
    if check["outcome"] == "fail":
        print(f"CONTRACT FAILED: {name}")
        failing = True
'''
