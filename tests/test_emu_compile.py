"""torch.compile(backend="neuron"): caching, recompiles, dynamic refusal, partitions, strict."""

import pytest
import torch

import neuron_emu

N = "neuron"
pytestmark = pytest.mark.filterwarnings("ignore:neuron. operator")


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    neuron_emu.reset_compile_stats()
    yield
    neuron_emu.set_strict(False)
    neuron_emu.use_build(neuron_emu.shipped_builds()[-1])
    torch._dynamo.reset()


def test_compile_counts_and_recompile_on_new_shape():
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(N)
    f = torch.compile(m, backend="neuron")
    x3 = torch.randn(3, 4, device=N)
    torch.testing.assert_close(f(x3).cpu(), m(x3).cpu())
    f(x3)
    s = neuron_emu.compile_stats()
    assert s["compiles"] == 1 and s["cache_hits"] == 1 and s["recompiles"] == 0
    for n in (5, 7, 7):  # automatic-dynamic must not make a symbolic graph: one compile per shape
        f(torch.randn(n, 4, device=N))
    s = neuron_emu.compile_stats()
    assert s["compiles"] == 3 and s["recompiles"] == 2 and s["cache_hits"] == 2
    sigs = {g["signature"] for g in s["graphs"]}
    assert all(isinstance(d, int) for sig in sigs for item in sig if item[0] == "T" for d in item[1])
    assert s["compile_seconds"] > 0


def test_dynamo_reset_forgets_the_compiled_graphs():
    """``torch._dynamo.reset()`` ("as if in a fresh process") resets the backend: its graphs are
    lowered again, never taken from what an earlier compiled model left in the process."""
    x = torch.randn(3, device=N)
    torch.compile(lambda t: t.relu() * 2, backend="neuron")(x)
    torch._dynamo.reset()
    neuron_emu.reset_compile_stats()
    torch.compile(lambda t: t.relu() * 2, backend="neuron")(x)
    assert neuron_emu.compile_stats()["compiles"] == 1 and neuron_emu.compile_stats()["recompiles"] == 0


def test_dynamic_true_refused():
    f = torch.compile(lambda x: x * 2, backend="neuron", dynamic=True)
    with pytest.raises(Exception, match="dynamic shapes are not supported"):
        f(torch.randn(3, device=N))


def test_partitions_and_training_graphs():
    neuron_emu.use_build("2.31.0")
    w = torch.randn(4, 4, device=N, requires_grad=True)

    def fn(x):
        return torch.special.i0(x @ w).relu().sum()

    f = torch.compile(fn, backend="neuron")
    f(torch.randn(2, 4, device=N)).backward()
    assert w.grad is not None
    graphs = neuron_emu.compile_stats()["graphs"]
    kinds = [g["kind"] for g in graphs]
    assert "forward" in kinds and "backward" in kinds
    fw = graphs[kinds.index("forward")]
    assert [p["kind"] for p in fw["partitions"]] == ["native", "fallback", "native"]
    assert "aten::i0.default" in fw["fallback_ops"] and "aten::mm.default" in fw["native_ops"]


def test_compiled_numerics_match_eager():
    neuron_emu.use_build("2.31.0")
    x = torch.tensor([9.0, 0.5], device=N)
    f = torch.compile(lambda t: torch.sin(t), backend="neuron")
    torch.testing.assert_close(f(x).cpu(), torch.sin(x).cpu())


def test_strict_compile_error():
    neuron_emu.use_build("2.31.0")
    neuron_emu.set_strict(True)
    f = torch.compile(lambda t: torch.special.i0(t) + 1, backend="neuron")
    with pytest.raises(Exception, match=r"aten::i0\.default"):
        f(torch.randn(3).to(N))
