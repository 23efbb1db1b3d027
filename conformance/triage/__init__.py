"""Triage: what a finding means for the people who act on it. ``upstream`` (the upstream
project's own expectations, against a run), ``repro`` (a standalone script per stored result),
``ledger_review`` (ledger entries a run shows stale, overrides it suggests).
"""
