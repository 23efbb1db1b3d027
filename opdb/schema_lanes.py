"""Columns of the lanes' tables (the perf lane, schema v16; the distributed lane, v17): their
own sessions and results, apart from the op and model runs. :mod:`opdb.schema` creates them.
"""

from __future__ import annotations

# The perf lane (schema v16; conformance/perf): a session that measured a candidate build against a
# baseline build interleaved, and per item what it found.
PERF_RUNS = {
    "id": str,
    "target": str,
    "build": str,  # the candidate
    "baseline_build": str,  # the baseline (the same build: an A/A run)
    "torch_version": str,
    "host": str,
    "machine": str,  # JSON: CPU model, cores, load when it started and finished
    "started_at": str,
    "finished_at": str,
    "status": str,  # running | finished | interrupted | infra
    "config": str,  # JSON: the PerfSpec (selection, threshold, confidence, rounds, ...)
}

PERF_RESULTS = {
    "run_id": str,
    "item_key": str,  # kind|subject|dtype|shape
    "kind": str,  # op | model
    "subject": str,  # OpInfo name or model id
    "dtype": str,
    "shape": str,  # small | medium | large | v0 ...
    "signature": str,  # the inputs' dtypes and shapes
    "status": str,  # ok | error | crash | timeout | skip
    "error": str,
    "p50": float,  # the candidate's call time (seconds), over every timed call
    "p99": float,
    "base_p50": float,
    "base_p99": float,
    "ratio": float,  # candidate / baseline: median of the paired round ratios (the confirmation's when confirmed)
    "low": float,  # its interval
    "high": float,
    "verdict": str,  # regression | improvement | same (NULL when not ok)
    "confirmed": int,  # 1: a fresh measurement called it again; 0: it did not (verdict then 'same'); NULL: nothing to confirm
    "first_ratio": float,  # the first measurement's ratio and interval (before the confirmation)
    "first_low": float,
    "first_high": float,
    "rounds": int,
    "reps": int,  # timed calls per side per round (the last rounds': undecided items double it)
    "reached": str,  # JSON list: the ATen overloads the candidate's call reached
    "load": float,  # the 1-minute load average when it was measured
    "wall_s": float,
    "recorded_at": str,
}

# The distributed lane (schema v17; conformance/dist): collectives on a target's c10d backend.
DIST_RUNS = {
    "id": str,
    "target": str,
    "build": str,
    "torch_version": str,
    "backend": str,  # the torch.distributed backend the target's device used
    "started_at": str,
    "finished_at": str,
    "status": str,  # running | finished | interrupted
    "config": str,  # JSON: the DistSpec (world sizes, collectives, dtypes, timeout)
}

DIST_RESULTS = {
    "run_id": str,
    "item_key": str,  # collective|reduce_op|dtype|world_size|shape
    "collective": str,  # the torch.distributed function
    "reduce_op": str,  # sum | product | min | max | avg | ''
    "dtype": str,
    "world_size": int,
    "shape": str,  # empty | vector | matrix | noncontiguous, or all-to-all's even | uneven | empty
    "status": str,  # pass | mismatch | error | crash | timeout | skip
    "error": str,
    "evidence": str,  # JSON: the failing rank, element, value, expected, error in eps; ranks per status
    "wall_s": float,
    "recorded_at": str,
}

# The generation lane (schema v18; conformance/generate): greedy decoding of causal LMs on the target
# against the CPU, per model x dtype x mode x prompt-length bucket. A work kind of the run: rows carry
# the run's item columns (opdb.schema._ITEM) and these.
GEN_RESULTS = {
    "model_id": str,  # hf.<model_type>
    "params": str,  # JSON: library, arch_family, model_type, vocab, parameters
    "dtype": str,
    "mode": str,  # eager | compile
    "bucket": int,  # the prompt length (tokens)
    "cache": str,  # static | dynamic: the KV cache generate decoded with
    "prompts": int,  # sequences decoded
    "new_tokens": int,  # greedy tokens per sequence
    "agreement": float,  # share of the sequences whose new tokens equal the CPU's exactly
    "near_tie_flips": int,  # sequences whose first divergence is a near tie (the near-tie rule)
    "wide_flips": int,  # sequences whose first divergence is at a wide margin (a mismatch)
    "first_divergence": int,  # the earliest divergent new-token position over the sequences (NULL: none)
    "margin": float,  # the CPU's top-1/top-2 logit margin at the reported divergence (the first wide flip, else the first near tie)
    "margin_tol": float,  # the near-tie rule's bound there
    "logits_rel_err": float,  # worst ||t - c|| / ||c|| of a step's logits over the steps before any divergence
    "loglik_cpu": float,  # mean log-probability (nats/token) of the fixed continuation on the CPU
    "loglik_target": float,  # ... on the target
    "loglik_shift": float,  # |target - cpu|
    "loglik_tol": float,  # its bound (conformance/data/generation.toml)
    "prefill_ms": float,  # the target's prefill (prompt forward + first token), median over the sequences
    "decode_p50_ms": float,  # the target's per-token decode time over every timed step
    "decode_p99_ms": float,
    "cpu_decode_p50_ms": float,  # the CPU's, for scale
    "cpu_decode_p99_ms": float,
    "recompiles": int,  # compile mode: graphs compiled while this bucket decoded
    "graphs": int,  # compile mode: graphs compiled by the end of this bucket (the model's total so far)
    "fallback_ops": str,  # JSON list: overloads that ran on the CPU fallback while decoding
    "first_divergent_op": str,  # at a wide flip or a log-likelihood shift: the localised overload
    "first_divergent_detail": str,
    "evidence": str,  # JSON: per sequence, the first divergence, its kind, margin and bound, both tokens
}
