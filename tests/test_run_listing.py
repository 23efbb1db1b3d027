"""A run lists its groups where the OpInfo database is loaded already: in a process forked from
the worker server when the supervisor has not imported it (conformance.run.runner._listed), with
the same groups and the same refusals as listing them in the supervisor."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
from conformance.run.runner import RunSpec, check
from conformance.select import SelectionError
groups = check(RunSpec(target="cpu", ops=("abs", "nn.functional.relu*"), dtypes=("float32", "int64")))
try:
    check(RunSpec(target="cpu", ops=("no_such_op*",)))
    refused = None
except SelectionError as exc:
    refused = str(exc)
print(json.dumps({"groups": [g.key for g in groups], "refused": refused,
                  "op_db": "torch.testing._internal.common_methods_invocations" in sys.modules}))
"""


def test_groups_are_listed_by_the_worker_server_not_the_supervisor():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert not got["op_db"]  # the supervisor never imported the OpInfo database
    from conformance.run.kinds import select_groups

    assert got["groups"] == [g.key for g in select_groups(["abs", "nn.functional.relu*"], ["float32", "int64"])]
    assert got["refused"] and "'no_such_op*' matches no OpInfo" in got["refused"]
