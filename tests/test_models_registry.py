"""Fast checks of the model-graph generator (``conformance.models``); the full-corpus hash
count is ``@pytest.mark.slow``."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import torch

from conformance.models import FAMILIES, GraphSpec, aten_histogram, enumerate_graphs, graph_hash, spec_by_id
from conformance.models.family import float_leaves

EXPECTED_FAMILIES = {
    "mlp", "resnet", "mobilenet", "unet", "diffusion", "encoder", "gpt", "vit",
    "audio", "rnn", "moe", "dlrm", "gnn", "vae", "seq2seq",
}  # fmt: skip


def first(family: str, **where: object) -> GraphSpec:
    return next(s for s in enumerate_graphs([family]) if all(s.params[k] == v for k, v in where.items()))


def test_families_registered_with_enough_specs() -> None:
    assert set(FAMILIES) == EXPECTED_FAMILIES
    counts = defaultdict(int)
    for spec in enumerate_graphs():
        counts[spec.family] += 1
    assert all(counts[f] >= 50 for f in EXPECTED_FAMILIES), counts
    assert 2000 <= sum(counts.values()) <= 3200


def test_enumeration_is_deterministic_and_ids_unique() -> None:
    a = [s.model_id for s in enumerate_graphs()]
    assert a == [s.model_id for s in enumerate_graphs()]
    assert len(set(a)) == len(a)
    vae_first = [s.model_id for s in enumerate_graphs(["vae", "mlp"], limit=3)]
    assert vae_first == [i for i in a if i.startswith("vae.")][:3]
    assert spec_by_id(a[7]).model_id == a[7]


def test_unknown_family_raises_with_known_names() -> None:
    with pytest.raises(ValueError, match="nope") as info:
        enumerate_graphs(["mlp", "nope"])
    assert "gpt" in str(info.value) and "mlp" in str(info.value)


@pytest.mark.parametrize("family", sorted(EXPECTED_FAMILIES))
def test_family_trains_and_sweeps_shapes(family: str) -> None:
    spec = first(family)
    model = spec.build()
    variants = spec.shape_variants()
    assert len(variants) == 3
    for a, b in zip(variants[0], spec.example_inputs(), strict=True):
        assert torch.equal(a, b)
    out = model(*spec.example_inputs())
    loss = spec.loss(out)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    shapes = set()
    for inputs in variants[1:]:
        out = model(*inputs)
        assert all(torch.isfinite(t).all() for t in float_leaves(out))
        shapes.add(tuple(tuple(x.shape) for x in inputs))
    assert len(shapes) == 2, "shape variants must differ"


@pytest.mark.parametrize("family", sorted(f for f, fam in FAMILIES.items() if fam.supports_bf16))
def test_bf16_forward(family: str) -> None:
    spec = first(family)
    model = spec.build().to(torch.bfloat16)
    inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in spec.example_inputs())
    assert all(torch.isfinite(t.float()).all() for t in float_leaves(model(*inputs)))


def test_decode_step_updates_cache() -> None:
    spec = first("gpt", mode="decode")
    token, k, v, pos = spec.example_inputs()
    _, k2, _ = spec.build()(token, k, v, pos)
    changed = (k2 != k).flatten(0, 2).any(-1).any(0)  # per cache position
    assert changed.tolist() == [i == int(pos) for i in range(k.shape[3])]


def test_build_is_deterministic_and_restores_global_rng() -> None:
    spec = first("gpt", mode="prefill")
    state = torch.default_generator.get_state()
    m1, m2 = spec.build(), spec.build()
    assert torch.equal(state, torch.default_generator.get_state())
    for (n1, t1), (n2, t2) in zip(m1.state_dict().items(), m2.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(t1, t2)
    x = spec.example_inputs()
    assert torch.equal(m1(*x), m2(*x))
    other = dataclasses.replace(spec, seed=1).build()
    assert not torch.equal(other.tok.weight, m1.tok.weight)


def test_hash_stable_and_structural() -> None:
    spec = first("mlp", depth=2, norm="ln")
    h = spec.graph_hash()
    assert h == spec.graph_hash()
    assert dataclasses.replace(spec, seed=123).graph_hash() == h  # new weights and inputs, same graph
    wider = first("mlp", depth=2, norm="ln", width=32)
    assert spec.params["width"] != 32 and wider.graph_hash() != h
    assert first("mlp", depth=2, norm="ln", act="gelu").graph_hash() != h


def test_hash_ignores_parameter_values_and_sees_shapes() -> None:
    lin1, lin2 = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    torch.nn.init.zeros_(lin2.weight)
    x = torch.randn(2, 4)
    assert graph_hash(lin1, (x,)) == graph_hash(lin2, (x * 7,))
    assert graph_hash(lin1, (x,)) != graph_hash(lin1, (torch.randn(5, 4),))
    assert graph_hash(lin1, (x,)) != graph_hash(torch.nn.Linear(4, 3, bias=False), (x,))


@pytest.mark.parametrize(
    ("family", "where", "op"),
    [
        ("gpt", {"mode": "prefill"}, "aten::_scaled_dot_product_flash_attention_for_cpu.default"),
        ("gpt", {"mode": "decode"}, "aten::index_copy.default"),
        ("moe", {"routing": "scatter"}, "aten::topk.default"),
        ("gnn", {"conv": "gat"}, "aten::scatter_reduce.two"),
        ("gnn", {"conv": "gcn"}, "aten::index_add.default"),
        ("dlrm", {}, "aten::_embedding_bag.default"),
        ("diffusion", {}, "aten::native_group_norm.default"),
        ("mobilenet", {}, "aten::convolution.default"),
    ],
)
def test_histogram_contains_expected_ops(family: str, where: dict, op: str) -> None:
    spec = first(family, **where)
    hist = aten_histogram(spec.build(), spec.example_inputs())
    assert hist.get(op, 0) >= 1, sorted(hist)
    assert all(k.count("::") == 1 and "." in k for k in hist)


@pytest.mark.slow
def test_corpus_has_2000_distinct_graphs() -> None:
    per_family: dict[str, set[str]] = defaultdict(set)
    for spec in enumerate_graphs():
        per_family[spec.family].add(spec.graph_hash())
    assert all(len(h) >= 50 for h in per_family.values()), {f: len(h) for f, h in per_family.items()}
    assert len(set().union(*per_family.values())) >= 2000


def test_export_method_traces_core_aten() -> None:
    lin, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
    assert graph_hash(lin, (x,), method="export") == graph_hash(torch.nn.Linear(4, 3), (x,), method="export")
    assert aten_histogram(lin, (x,), method="export") == {
        "aten::addmm.default": 1,
        "aten::permute.default": 1,
    }
    with pytest.raises(ValueError, match="unknown trace method"):
        graph_hash(lin, (x,), method="jit")


def test_a_trace_survives_dead_weak_proxies_and_leaves_the_harness_caches_alone():
    """The trace empties the function caches of the model's own libraries around it. It scans the
    heap for them, which holds weak proxies: a dead one raised ReferenceError at ``isinstance`` and
    failed the model items of a fixed nightly. The harness's own caches are never emptied."""
    import functools
    import weakref

    from conformance.models import tracing

    class Referent:
        pass

    gone = Referent()
    proxy = weakref.proxy(gone)
    del gone  # the proxy stays on the heap, dead

    @functools.cache
    def ours(x: int) -> int:
        return x

    ours.__module__ = "conformance.models.fake_cache"
    ours(1)

    @functools.cache
    def theirs(x: int) -> int:
        return x

    theirs.__module__ = "somelib.anchors"
    theirs(1)

    def forward(self, x):  # noqa: ANN001, ANN202
        return x * 2

    layer = type("Layer", (torch.nn.Module,), {"__module__": "somelib.layers", "forward": forward})
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), layer())
    tracing.trace(model, (torch.randn(1, 2),))  # raised ReferenceError with the dead proxy on the heap
    assert theirs.cache_info().currsize == 0  # the model's library's cache was emptied
    assert ours.cache_info().currsize == 1  # the harness's stays
    assert proxy is not None
