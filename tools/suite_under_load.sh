#!/usr/bin/env bash
# Runs the test suite N times in a row (default 2) while two CPU-burning processes compete for
# the cores, as on a shared CI machine; prints each run's wall time and result line.
#   bash tools/suite_under_load.sh [N] [pytest args...]
# Uses `nox -s tests` (the README's test command) unless PYTEST is set to a python to run
# `PYTEST -m pytest -n 2 --dist loadgroup` directly (faster to iterate on).
set -u
cd "$(dirname "$0")/.."
n=${1:-2}; shift || true
burners=()
for _ in 1 2; do python3 -c "while 1: pass" & burners+=($!); done
trap 'kill "${burners[@]}" 2>/dev/null' EXIT
rc_all=0
for i in $(seq 1 "$n"); do
  t0=$(date +%s)
  if [ -n "${PYTEST:-}" ]; then
    "$PYTEST" -m pytest -n 2 --dist loadgroup -q "$@" > "/tmp/suite_under_load_$i.log" 2>&1; rc=$?
  else
    python3 -m nox -s tests -- -n 2 --dist loadgroup -q "$@" > "/tmp/suite_under_load_$i.log" 2>&1; rc=$?
  fi
  echo "run $i: rc=$rc wall=$(( $(date +%s) - t0 ))s  $(grep -E '(passed|failed)' "/tmp/suite_under_load_$i.log" | tail -1)"
  [ "$rc" -eq 0 ] || rc_all=$rc
done
exit "$rc_all"
