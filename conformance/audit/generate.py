"""The audit's generation step (``conformance audit --generate``): will a user's causal LM answer
the same on the target as on the CPU?

The generation lane's own measurement (:func:`conformance.generate.lane.measure`), run on the
user's model instead of a zoo model: per dtype x mode x prompt-length bucket, ``prompts`` seeded
prompts of exactly the bucket's length (token ids drawn from the model's vocabulary, seeded by the
model's reference) greedy-decoded on the target and on the CPU with the cache a server keeps, judged
by the lane's near-tie rule and log-likelihood bound (``conformance/data/generation.toml``), timed
(prefill, decode p50/p99 per token, the CPU's p50 beside them), its fallbacks traced, the compiled
path's recompiles per bucket counted, and a wide flip or a log-likelihood shift on the eager path
localised to its first divergent op. Each row's ``status`` is the status vocabulary's; the audit's
verdict is blocked by any failing row.

A model that is not a causal LM (no ``generate``, no ``config.vocab_size``) is bad input
(:class:`~.results.AuditInputError`, exit 2) before anything runs; a bucket longer than the model's
positions (bucket + new tokens or the scored continuation) is a ``skip`` row saying so.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import torch
from torch import nn

from .results import AuditInputError, AuditResult, GenerateConfig

DTYPES = ("float32", "bfloat16")


def check_lm(model: Any, ref: str) -> None:
    """Refuse what ``generate`` cannot decode with: exit 2, saying what is missing."""
    missing = [what for what, ok in (
        ("a generate method", callable(getattr(model, "generate", None))),
        ("config.vocab_size", isinstance(getattr(getattr(model, "config", None), "vocab_size", None), int)),
        ("to be an nn.Module", isinstance(model, nn.Module))) if not ok]
    if missing:
        raise AuditInputError(f"--generate needs a causal language model (a transformers model such as "
                              f"AutoModelForCausalLM.from_config(...)); {ref} returned {type(model).__name__}, "
                              f"which lacks {' and '.join(missing)}")


def vocab_of(model: nn.Module) -> int:
    from conformance.generate import lms

    try:
        return lms.vocab(model)
    except Exception:  # noqa: BLE001 - no output embeddings to read: the config says
        return int(model.config.vocab_size)


def options(cfg: GenerateConfig) -> Any:
    from conformance.datafiles import generation
    from conformance.generate.lane import Options

    s = generation()
    return Options(tuple(cfg.modes) or ("eager", "compile"), tuple(sorted(cfg.buckets)) or s.buckets,
                   cfg.new_tokens or s.new_tokens)


def example_inputs(model: nn.Module, label: str, cfg: GenerateConfig) -> tuple:
    """The forward audit's example input when none is given: the smallest bucket's first prompt."""
    from conformance.generate import lms

    return (lms.prompts(label, min(options(cfg).buckets), vocab=vocab_of(model), n=1)[0],)


def positions(model: nn.Module) -> int | None:
    """The fewest positions any of the model's configs declares (None: it declares none)."""
    from conformance.generate.lms import POSITION_KEYS

    found = [v for c in (model.config, getattr(model.config, "text_config", None)) if c is not None
             for k in POSITION_KEYS if isinstance(v := getattr(c, k, None), int) and not isinstance(v, bool) and v > 0]
    return min(found) if found else None


def run_generation(model: nn.Module, target: Any, label: str, cfg: GenerateConfig, res: AuditResult) -> None:
    """Decode ``model`` (the CPU original, never mutated) per dtype x mode x bucket; fill ``res.generation``."""
    from conformance.datafiles import generation
    from conformance.generate import decode
    from conformance.generate.lane import Decoding, measure

    settings, opts = generation(), options(cfg)
    modes = opts.modes
    if getattr(target, "compiler", False):  # as the lane: a compiler target compiles every item
        modes = tuple(m for m in modes if m == "compile") or modes
    limit = positions(model)
    vocab = vocab_of(model)
    rows: list[dict[str, Any]] = []
    kind = "-"
    for dtype in cfg.dtypes:
        cpu = copy.deepcopy(model).to(getattr(torch, dtype)).eval()
        kind = decode.cache_kind(cpu)
        decoding = Decoding(target, cpu, label, dtype, opts, settings, kind, vocab)
        for mode in modes:
            for bucket in opts.buckets:
                row: dict[str, Any] = {"dtype": dtype, "mode": mode, "bucket": bucket}
                need = bucket + max(opts.new_tokens, settings.continuation)
                if limit is not None and need > limit:
                    row.update(status="skip", error=f"the model has {limit} positions; bucket {bucket} needs {need} "
                                                    f"(the prompt and {need - bucket} more tokens)")
                else:
                    row.update(_readable(measure(decoding, mode, bucket)))
                rows.append(row)
    res.generation = {
        "settings": {"buckets": list(opts.buckets), "new_tokens": opts.new_tokens, "prompts": settings.prompts,
                     "continuation": settings.continuation, "timing_repeats": settings.timing_repeats,
                     "modes": list(modes), "dtypes": list(cfg.dtypes), "cache": kind, "vocab": vocab,
                     "positions": limit, "near_tie_factor": settings.near_tie_factor},
        "rows": rows}
    res.generation["summary"] = summary(res.generation)


def _readable(row: dict[str, Any]) -> dict[str, Any]:
    """A lane row as the audit shows it: its JSON columns parsed, the reported flip's tokens lifted."""
    out = dict(row)
    for key in ("fallback_ops", "evidence", "first_divergent_detail"):
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key])
    seqs = (out.pop("evidence", None) or {}).get("sequences", [])
    out["sequences"] = seqs
    flips = [(i, s) for i, s in enumerate(seqs) if s.get("kind") == "wide"] or \
            [(i, s) for i, s in enumerate(seqs) if s.get("kind") == "near_tie"]
    if flips:  # the judge's reported flip: the earliest wide one, else the earliest near tie
        i, s = min(flips, key=lambda f: f[1].get("position") or 0)
        out["flip"] = {"prompt": i, **s}
    return out


def passed(row: dict[str, Any]) -> bool:
    from opdb.status import PASSED

    return row["status"] in {s.value for s in PASSED}


def failing(row: dict[str, Any]) -> bool:
    from opdb.status import FAILING

    return row["status"] in {s.value for s in FAILING}


def _where(row: dict[str, Any]) -> str:
    return f"{row['dtype']} {row['mode']} {row['bucket']}"


def summary(gen: dict[str, Any]) -> str:
    """The one line: in how many buckets (dtype x mode x bucket) it generates the same as the CPU."""
    rows, s = gen["rows"], gen["settings"]
    same = sum(passed(r) for r in rows)
    grid = f"{', '.join(s['dtypes'])} x {', '.join(s['modes'])} x {', '.join(map(str, s['buckets']))} tokens"
    line = (f"generates the same as the CPU in {same} of {len(rows)} bucket{'s' * (len(rows) != 1)} ({grid}; "
            f"{s['prompts']} prompts x {s['new_tokens']} new tokens each)")
    others = [r for r in rows if not passed(r)]
    if others:
        by: dict[str, list[str]] = {}
        for r in others:
            by.setdefault(r["status"], []).append(_where(r))
        line += ": " + "; ".join(f"{st} at {', '.join(w[:4])}{' ...' if len(w) > 4 else ''}" for st, w in by.items())
    return line


def blockers(res: AuditResult) -> list[str]:
    """One blocker naming every failing bucket, with the first one's reason and divergent op."""
    if not res.generation:
        return []
    bad = [r for r in res.generation["rows"] if failing(r)]
    if not bad:
        return []
    first = bad[0]
    op = next((r["first_divergent_op"] for r in bad if r.get("first_divergent_op")), None)
    return [f"generation differs from the CPU in {len(bad)} of {len(res.generation['rows'])} buckets "
            f"({', '.join(_where(r) for r in bad[:6])}{' ...' if len(bad) > 6 else ''}): "
            f"{first['status']} at {_where(first)}: {(first.get('error') or '').splitlines()[0][:300] if first.get('error') else ''}"
            + (f"; first divergent op {op}" if op else "")]


def fallbacks(res: AuditResult) -> list[str]:
    rows = (res.generation or {}).get("rows", [])
    return sorted({op for r in rows if not failing(r) for op in (r.get("fallback_ops") or [])})


def notes(res: AuditResult) -> list[str]:
    """Warnings: the buckets not decoded (skips), the compiled path's recompiles."""
    rows = (res.generation or {}).get("rows", [])
    out = [f"generation skipped at {_where(r)}: {r.get('error') or ''}"[:300] for r in rows if r["status"] == "skip"]
    rec = [r for r in rows if r.get("recompiles")]
    if rec:
        out.append("compiled generation recompiles per bucket: "
                   + ", ".join(f"{_where(r)}: {r['recompiles']}" for r in rec))
    return out


def found_causes(res: AuditResult) -> list[tuple[Any, str]]:
    """The error causes of the failing buckets, as the sweep names them."""
    from conformance.triage.signature import Signature, op_signature

    out = []
    for r in (res.generation or {}).get("rows", []):
        if not failing(r):
            continue
        sig = (Signature("mismatch", "", "generated tokens differ", r.get("first_divergent_op") or "")
               if r["status"] == "mismatch" else op_signature({"status": r["status"], "error": r.get("error") or ""}))
        out.append((sig, f"generation {_where(r)}"))
    return out
