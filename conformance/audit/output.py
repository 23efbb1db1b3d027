"""An audit as text (the CLI), JSON and an HTML page in the report's style."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from . import generate as gen
from .results import PLUMBING, AuditResult


def fmt(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return "inf"
    if v == 0:
        return "0"
    return f"{v:.{digits - 1}e}" if abs(v) < 1e-3 or abs(v) >= 1e5 else f"{v:.{digits}g}"


def verdict_line(res: AuditResult) -> str:
    if res.verdict == "blocked":
        return f"verdict: blocked ({len(res.blockers)} blocker{'s' * (len(res.blockers) != 1)})"
    if res.verdict == "ready with fallbacks":
        n = len(res.fallbacks)
        return (f"verdict: ready with fallbacks ({n} op{'s fall' if n != 1 else ' falls'} back to the CPU: {', '.join(res.fallbacks[:4])}{' ...' if len(res.fallbacks) > 4 else ''})")
    return "verdict: ready"


def text_lines(res: AuditResult, *, timings: bool = True) -> list[str]:
    L = [f"audit of {res.model} on {res.target} {res.build} (torch {res.torch_version})",
         f"inputs: {res.inputs}" + (f"; shape sets: {len(res.shape_sets)}" if len(res.shape_sets) > 1 else ""),
         f"capture: {res.capture.get('detail', '')}"]
    if res.db:
        L.append(f"sweep results: {res.db['detail']}")
    model_ops = [o for o in res.ops if o.name not in PLUMBING]
    marks = Counter(o.marked for o in model_ops)
    L += ["", f"ops ({len(model_ops)} overloads, {sum(o.eager_calls for o in model_ops)} eager calls; "
          + ", ".join(f"{n} {k}" for k, n in sorted(marks.items())) + ")"]
    w = max([len(o.name) for o in model_ops] + [10])
    L.append(f"  {'overload':<{w}}  {'eager':>5}  {'export':>6}  {'on target':<9}  check")
    for o in model_ops:
        exp = "-" if o.export_calls is None else str(o.export_calls)
        check = o.status + (f" ({o.source})" if o.source and o.source != "isolated check" else "")
        if o.err is not None and o.status in ("pass", "mismatch"):
            check += f" err {fmt(o.err)}"
        if o.status in ("mismatch", "error") or (o.detail and o.status == "skip" and "random" not in o.detail) \
                or (o.detail and o.marked == "fallback"):
            check += f": {o.detail[:140]}"
        L.append(f"  {o.name:<{w}}  {o.eager_calls:>5}  {exp:>6}  {o.marked:<9}  {check}")
    L += ["", "dtype and layout risks"]
    L += [f"  - {r.kind}: {r.what}" + (f" ({r.detail})" if r.detail else "") for r in res.risks] or ["  none"]
    L += ["", f"parity (tolerance ||t - c|| / ||c|| <= {res.tolerance['fwd_rtol']:g}, {res.tolerance['dtype']})"]
    if res.target_error:
        L.append(f"  the model raises on the target: {res.target_error.splitlines()[0][:200]}")
    for o in res.outputs:
        L.append(f"  {o.name or f'output {o.index}'} [{','.join(map(str, o.shape))}] {o.dtype}: {'pass' if o.ok else 'FAIL'}"
                 f"  rel err {fmt(o.rel_err)}  max abs err {fmt(o.max_abs_err)}"
                 + (f"  ({o.detail})" if o.detail else ""))
    if res.gradients is not None:
        g = res.gradients
        L.append(f"  gradients ({g.get('parameters', '?')} parameters): {'pass' if g['ok'] else 'FAIL'}  "
                 f"worst rel err {fmt(g.get('worst_rel_err'))}" + (f"  ({g['detail']})" if g["detail"] else ""))
    if res.training is not None:
        t = res.training
        curve = ""
        if t.get("cpu_loss"):
            curve = "  loss cpu " + " ".join(fmt(x, 4) for x in t["cpu_loss"]) + " | target " + \
                    " ".join(fmt(x, 4) for x in t["target_loss"])
        L.append(f"  {t['steps']}-step SGD: {'pass' if t['ok'] else 'FAIL'}{curve}"
                 + (f"  ({t['detail']})" if t["detail"] and not t["ok"] else ""))
    if res.first_divergent_detail:
        L.append(f"  first divergent op: {res.first_divergent_op or '-'}: {res.first_divergent_detail[:400]}")
    if res.compile:
        c = res.compile
        L += ["", f"compile (torch.compile backend={c['backend']!r}, dynamic=False): {c['compiles']} compile(s), "
                  f"{c['recompiles']} recompile(s), first call {fmt(c['compile_s'])} s"]
        wl = max([len(s.inputs) for s in res.shapes] + [6])
        L.append(f"  {'inputs':<{wl}}  {'compiles':>8}  {'recompiled':>10}  {'parity':>6}  {'p50 ms':>8}  {'p99 ms':>8}")
        for s in res.shapes:
            par = "-" if s.parity_ok is None else ("pass" if s.parity_ok else "FAIL")
            L.append(f"  {s.inputs:<{wl}}  {s.compiles:>8}  {'yes' if s.recompiled else 'no':>10}  {par:>6}  "
                     f"{fmt(s.p50_ms):>8}  {fmt(s.p99_ms):>8}" + (f"  error: {s.error[:160]}" if s.error else ""))
    L += generation_lines(res)
    L += ["", verdict_line(res)]
    for i, b in enumerate(res.blockers, 1):
        L.append(f"  {i}. {b[:400]}")
    if res.causes:
        L += ["", f"error causes ({len(res.causes)})"]
        for c in res.causes:
            seen = f"; the sweep saw it on {', '.join(c['seen_in'][-3:])}" if c["seen_in"] else ""
            L.append(f"  {c['key']} {c['text'][:160]} ({', '.join(c['where'][:4])}{seen})")
            if c["explanation"]:
                L.append(f"      explained: {c['explanation'][:300]}")
            if c["workaround"]:
                L.append(f"      workaround: {c['workaround'][:300]}")
    if timings and res.timings:
        parts = ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in res.timings.items() if k != "total_s")
        L.append(f"audit took {res.timings.get('total_s', 0):.1f} s ({parts})")
    return L


def generation_lines(res: AuditResult) -> list[str]:
    """The report's "generation" section (:mod:`.generate`): a row per dtype x mode x bucket, the one line."""
    g = res.generation
    if not g:
        return []
    s = g["settings"]
    L = ["", f"generation (greedy; {s['prompts']} seeded prompts per bucket x {s['new_tokens']} new tokens, "
             f"{s['cache']} cache, vocab {s['vocab']}; near ties: CPU top-2 margin <= {s['near_tie_factor']:g} x rtol "
             "x rms(logits))"]
    L.append(f"  {'dtype':<8}  {'mode':<7}  {'bucket':>6}  {'status':<13}  {'agree':>5}  {'near':>4}  {'wide':>4}  "
             f"{'ll shift':>8}  {'ll bound':>8}  {'prefill ms':>10}  {'p50 ms':>7}  {'p99 ms':>7}  {'cpu p50':>7}  "
             f"{'recompiles':>10}  fallbacks")
    for r in g["rows"]:
        agree = "-" if r.get("agreement") is None else f"{round(r['agreement'] * s['prompts'])}/{s['prompts']}"
        rec = "-" if r.get("recompiles") is None else str(r["recompiles"])
        fb = ", ".join(r.get("fallback_ops") or []) or ("-" if r.get("fallback_ops") is None else "none")
        L.append(f"  {r['dtype']:<8}  {r['mode']:<7}  {r['bucket']:>6}  {r['status']:<13}  {agree:>5}  "
                 f"{_n(r.get('near_tie_flips')):>4}  {_n(r.get('wide_flips')):>4}  {fmt(r.get('loglik_shift')):>8}  "
                 f"{fmt(r.get('loglik_tol')):>8}  {fmt(r.get('prefill_ms')):>10}  {fmt(r.get('decode_p50_ms')):>7}  "
                 f"{fmt(r.get('decode_p99_ms')):>7}  {fmt(r.get('cpu_decode_p50_ms')):>7}  {rec:>10}  {fb}")
        L += [f"      {line}" for line in generation_detail(r)]
    L.append(f"  {g['summary']}")
    return L


def generation_detail(r: dict[str, Any]) -> list[str]:
    """Under a row: its reported flip (the first wide one, else the first near tie), why it fails
    when that is not a wide flip, its first divergent op."""
    out = []
    f = r.get("flip")
    n = len(r.get("sequences") or ())
    if f and f.get("kind") == "wide" and f.get("margin") is not None:
        out.append(f"{r.get('wide_flips')} of {n} sequences flip wide; the first (prompt {f['prompt']}, new token "
                   f"{f['position']}): CPU token {f['cpu_token']}, target {f['target_token']}; CPU margin "
                   f"{fmt(f['margin'])} > near-tie bound {fmt(f['bound'])}"
                   + (f", step logits rel err {fmt(f['step_rel_err'])}" if f.get("step_rel_err") is not None else ""))
    elif f and f.get("kind") == "near_tie":
        out.append(f"{r.get('near_tie_flips')} of {n} sequences flip at a near tie (within the rounding; not a "
                   f"failure); the first (prompt {f['prompt']}, new token {f['position']}): CPU margin "
                   f"{fmt(f['margin'])} <= bound {fmt(f['bound'])}")
    if r.get("error") and not gen.passed(r) and not (f and f.get("kind") == "wide" and f.get("margin") is not None):
        out.append(str(r["error"]).splitlines()[0][:300])
    if r.get("first_divergent_op"):
        d = r.get("first_divergent_detail") or {}
        score = (d.get("scores") or {}).get(r["first_divergent_op"])
        why = ([f"fed the CPU's inputs, its worst element is off by {fmt(score)} x the default tolerance"]
               if score is not None else []) + ([f"prompt {d['prompt']} re-decoded {d['new_tokens']} token(s)"]
                                                if "prompt" in d else [])
        out.append(f"first divergent op: {r['first_divergent_op']}" + (f" ({'; '.join(why)})" if why else ""))
    return out


def _n(v: Any) -> str:
    return "-" if v is None else str(v)


def write_json(res: AuditResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(res.as_json(), indent=1, allow_nan=False))


def write_html(res: AuditResult, out_dir: str | Path) -> Path:
    """``out_dir/index.html`` in the report's style (its base template and assets)."""
    import datetime as dt

    from reports.html import ASSETS, make_environment, write_asset

    out = Path(out_dir)
    (out / "assets").mkdir(parents=True, exist_ok=True)
    for name in ASSETS:
        write_asset(name, out / "assets" / name)
    env = make_environment()
    html = env.get_template("audit.html").render(
        title=f"Audit: {res.model} on {res.target} {res.build}", root="", nav=[],
        generated_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        db_label=(res.db or {}).get("path") or "no database", res=res, verdict=verdict_line(res),
        model_ops=[o for o in res.ops if o.name not in PLUMBING], fmt=fmt,
        st={"native": "pass", "fallback": "pass_fallback", "failing": "error"}, gen_detail=generation_detail)
    page = out / "index.html"
    page.write_text(html)
    return page
