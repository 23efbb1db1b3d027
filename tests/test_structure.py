"""conformance.structure: model outputs flattened to named leaves (no transformers needed)."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from conformance.audit.parity import forward_parity
from conformance.audit.results import AuditResult
from conformance.structure import (
    flatten,
    map_tensors,
    named_leaves,
    register_structure,
    tensor_leaves,
    unflatten,
)


class FakeLayer:
    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.keys, self.values, self.seen = k, v, 0


class FakeCache:
    """Like a KV cache: tensors in attributes of objects that are no pytree node."""

    def __init__(self, layers: list[FakeLayer]) -> None:
        self.layers = layers


register_structure(FakeCache, ["layers"])
register_structure(FakeLayer, ["keys", "values"])


@dataclass
class Out:
    logits: torch.Tensor
    extra: dict


def _value():
    cache = FakeCache([FakeLayer(torch.ones(2), torch.zeros(2)), FakeLayer(torch.ones(3), torch.ones(3))])
    NT = collections.namedtuple("NT", "a b")
    return Out(torch.randn(2, 3), {"cache": cache, "pair": (torch.ones(1), NT(torch.zeros(1), 7)), "not an id": None})


def test_paths_name_every_leaf():
    paths = [p for p, _ in named_leaves(_value())]
    assert paths == ["logits", "extra.cache.layers[0].keys", "extra.cache.layers[0].values",
                     "extra.cache.layers[1].keys", "extra.cache.layers[1].values",
                     "extra.pair[0]", "extra.pair[1].a", "extra.pair[1].b", "extra['not an id']"]
    assert named_leaves(torch.ones(1))[0][0] == "" and len(tensor_leaves(_value())) == 7


def test_unflatten_rebuilds_without_touching_the_original():
    v = _value()
    named, spec = flatten(v)
    w = unflatten(spec, [x * 0 + 5 if isinstance(x, torch.Tensor) else x for _, x in named])
    assert isinstance(w, Out) and isinstance(w.extra["cache"], FakeCache)
    assert w.extra["cache"].layers[1].values.tolist() == [5, 5, 5] and w.extra["cache"].layers[1].seen == 0
    assert v.extra["cache"].layers[1].values.tolist() == [1, 1, 1]
    assert w.extra["pair"][1].b == 7 and type(w.extra["pair"][1]).__name__ == "NT"
    with pytest.raises(ValueError, match="more values"):
        unflatten(spec, [x for _, x in named] + [1])
    assert map_tensors(lambda t: t.double(), v).extra["cache"].layers[0].keys.dtype == torch.float64


def test_forward_parity_names_the_failing_cache_leaf():
    cpu = _value()
    tgt = map_tensors(lambda t: t.clone(), cpu)
    tgt.extra["cache"].layers[1].values = tgt.extra["cache"].layers[1].values * 2
    res = AuditResult(model="m", target="t", build="b", torch_version="", inputs="", shape_sets=[], tolerance={},
                      capture={})
    tol = SimpleNamespace(atol=1e-5, rtol=1e-5, fwd_rtol=1e-3)
    assert forward_parity(cpu, tgt, tol, res) is True
    by = {o.name: o for o in res.outputs}
    assert not by["extra.cache.layers[1].values"].ok and by["extra.cache.layers[1].values"].rel_err == pytest.approx(1.0)
    assert by["logits"].ok and by["extra.cache.layers[0].keys"].ok
    assert [o.name for o in res.outputs if not o.ok] == ["extra.cache.layers[1].values"]


def test_forward_parity_reports_a_structure_difference_by_path():
    cpu = {"a": torch.ones(2), "b": torch.ones(2)}
    res = AuditResult(model="m", target="t", build="b", torch_version="", inputs="", shape_sets=[], tolerance={},
                      capture={})
    assert forward_parity(cpu, {"a": torch.ones(2), "c": torch.ones(2)}, SimpleNamespace(atol=0, rtol=0, fwd_rtol=0), res)
    assert "only on the target: c" in res.outputs[0].detail and "only on the CPU: b" in res.outputs[0].detail
