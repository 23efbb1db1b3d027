"""The emulated device's verdicts do not depend on the number of intra-op threads: a call below
ATen's grain size runs serially, and a large one's reduction order moves an error by an ULP at
most, never a status. Each side runs in its own process (the thread count is per process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_RUN = """
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(int(sys.argv[1]))
from conformance.sweep.opinfo import OPINFO, SweepConfig, run_group
from conformance.targets import get_target
from conformance.work import Selection
target = get_target("neuron-emu", "2.33.0")
groups = OPINFO.groups(Selection(ops=tuple(g for g in sys.argv[2].split(",") if g), dtypes=("float32",)))
config = SweepConfig(variants=("function", "backward"), contracts=("none",), max_samples=int(sys.argv[3]))
print(json.dumps({r["item_key"]: r["status"] for g in groups for r in run_group(target, g, config)}))
"""


def _statuses(threads: int, ops: str, samples: int) -> dict[str, str]:
    r = subprocess.run([sys.executable, "-c", _RUN, str(threads), ops, str(samples)], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _same(ops: str, samples: int) -> None:
    one, two = _statuses(1, ops, samples), _statuses(2, ops, samples)
    assert one and one.keys() == two.keys()
    differ = {k: (one[k], two[k]) for k in one if one[k] != two[k]}
    assert not differ, f"statuses differ between 1 and 2 intra-op threads: {differ}"


def test_statuses_are_the_same_with_one_and_two_threads_on_large_and_reducing_ops():
    _same("sum,mean,mm,matmul,softmax,cumsum,nn.functional.conv2d,nn.functional.layer_norm,add,exp", 4)


@pytest.mark.slow
def test_statuses_are_the_same_with_one_and_two_threads_on_every_float32_opinfo():
    _same("", 4)
