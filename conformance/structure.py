"""Model inputs and outputs as named leaves: one flattening for every place that compares them.

A model returns a tensor, a tuple, a dict, a Hugging Face ``ModelOutput``, a dataclass, or an
object that holds tensors without being a pytree node (a KV cache such as transformers'
``DynamicCache``). :func:`flatten` walks all of them and names each leaf by its path
(``logits``, ``past_key_values.layers[0].keys``), so a comparison can say which leaf fails;
:func:`unflatten` rebuilds the structure from new leaves (to move inputs to a device, or to feed
traced tensors into a model). The walk, at each node:

1. a class registered here (:func:`register_structure`: its tensors live in named attributes);
2. a ``torch.utils._pytree`` node (tuples, lists, dicts, namedtuples, ``torch.return_types``,
   ``ModelOutput``, whatever a library registered), keys from its ``flatten_with_keys_fn``;
3. a dataclass instance (its fields);
4. anything else is a leaf.

transformers' cache classes are registered the first time one is met (``Cache``: ``layers``;
a key/value layer: ``keys``, ``values``; a linear-attention layer: ``conv_states``,
``recurrent_states``); transformers is never imported here.

Example::

    >>> import torch
    >>> from conformance.structure import named_leaves
    >>> [p for p, _ in named_leaves({"logits": torch.zeros(2), "hidden": (torch.ones(1), 3)})]
    ['logits', 'hidden[0]', 'hidden[1]']
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.utils._pytree as pytree

# class -> the attributes that hold its children, in order (most specific class wins, by MRO)
_STRUCTURES: dict[type, tuple[str, ...]] = {}
# module that defines such classes -> registers them; run once, when the module is loaded
_LAZY: dict[str, Callable[[], None]] = {}


def register_structure(cls: type, attrs: Iterable[str]) -> None:
    """Flatten instances of ``cls`` (and its subclasses) through the attributes ``attrs``.

    An attribute that holds None stays a None leaf; :func:`unflatten` rebuilds by a shallow copy
    with the attributes set, so the original object is never changed.
    """
    attrs = tuple(attrs)
    if not isinstance(cls, type) or not attrs or not all(isinstance(a, str) and a.isidentifier() for a in attrs):
        raise TypeError(f"register_structure({cls!r}, {attrs!r}): expected a class and attribute names")
    _STRUCTURES[cls] = attrs


def _register_transformers_caches() -> None:
    cu = sys.modules["transformers.cache_utils"]
    for name, attrs in (("Cache", ("layers",)), ("EncoderDecoderCache", ("self_attention_cache", "cross_attention_cache")),
                        ("CacheLayerMixin", ("keys", "values")),
                        ("LinearAttentionCacheLayerMixin", ("conv_states", "recurrent_states"))):
        cls = getattr(cu, name, None)
        if isinstance(cls, type):
            register_structure(cls, attrs)


_LAZY["transformers.cache_utils"] = _register_transformers_caches


def _registered(t: type) -> tuple[str, ...] | None:
    for mod in [m for m in _LAZY if m in sys.modules]:
        _LAZY.pop(mod)()
    return next((_STRUCTURES[k] for k in t.__mro__ if k in _STRUCTURES), None)


@dataclasses.dataclass(frozen=True)
class Spec:
    """How to rebuild one node from its children's values (``rebuild`` None: a leaf)."""

    rebuild: Callable[[list[Any]], Any] | None
    children: tuple[Spec, ...] = ()
    leaves: int = 1


_LEAF = Spec(None)


def _key(k: Any) -> str:
    if isinstance(k, pytree.MappingKey) and isinstance(k.key, str) and k.key.isidentifier():
        return f".{k.key}"
    if isinstance(k, pytree.GetAttrKey):
        return f".{k.name}"
    return pytree.keystr((k,))


def _attrs_rebuild(obj: Any, attrs: tuple[str, ...]) -> Callable[[list[Any]], Any]:
    def rebuild(values: list[Any]) -> Any:
        new = copy.copy(obj)
        for a, v in zip(attrs, values, strict=True):
            object.__setattr__(new, a, v)
        return new
    return rebuild


def _children(value: Any) -> tuple[list[tuple[str, Any]], Callable[[list[Any]], Any]] | None:
    """(named children, rebuild) of a node; None for a leaf."""
    t = type(value)
    if isinstance(value, torch.Tensor):
        return None
    attrs = _registered(t)
    if attrs is not None:
        return [(f".{a}", getattr(value, a, None)) for a in attrs], _attrs_rebuild(value, attrs)
    node = pytree.SUPPORTED_NODES.get(pytree._get_node_type(value))  # namedtuples share one node type
    if node is not None:
        if node.flatten_with_keys_fn is not None:
            keyed, ctx = node.flatten_with_keys_fn(value)
            names = [_key(k) for k, _ in keyed]
            kids = [v for _, v in keyed]
        else:
            kids, ctx = node.flatten_fn(value)
            names = [f"[{i}]" for i in range(len(kids))]
        return list(zip(names, kids, strict=True)), lambda vals, ctx=ctx, node=node: node.unflatten_fn(vals, ctx)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        attrs = tuple(f.name for f in dataclasses.fields(value))
        return [(f".{a}", getattr(value, a)) for a in attrs], _attrs_rebuild(value, attrs)
    return None


def flatten(value: Any) -> tuple[list[tuple[str, Any]], Spec]:
    """([(path, leaf)], spec) of ``value``; paths as ``logits``, ``[0]``, ``past_key_values.layers[1].values``
    (a bare leaf's path is "")."""
    out: list[tuple[str, Any]] = []

    def walk(v: Any, path: str, depth: int) -> Spec:
        if depth > 64:
            raise ValueError(f"{path or 'the value'} nests more than 64 levels deep (a reference cycle?)")
        kids = _children(v)
        if kids is None:
            out.append((path.removeprefix("."), v))
            return _LEAF
        named, rebuild = kids
        specs = tuple(walk(c, path + n, depth + 1) for n, c in named)
        return Spec(rebuild, specs, sum(s.leaves for s in specs))

    spec = walk(value, "", 0)
    return out, spec


def named_leaves(value: Any) -> list[tuple[str, Any]]:
    """The (path, leaf) pairs of ``value`` in order."""
    return flatten(value)[0]


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors of ``value`` in order (caches and ModelOutputs walked)."""
    return [x for _, x in flatten(value)[0] if isinstance(x, torch.Tensor)]


def unflatten(spec: Spec, values: Iterable[Any]) -> Any:
    """``value`` rebuilt from :func:`flatten`'s spec and new leaves (as many as it had)."""
    it = iter(values)

    def build(s: Spec) -> Any:
        if s.rebuild is None:
            return next(it)
        return s.rebuild([build(c) for c in s.children])

    out = build(spec)
    if next(it, _END) is not _END:
        raise ValueError(f"unflatten: more values than the {spec.leaves} leaves of the structure")
    return out


_END = object()


def map_leaves(fn: Callable[[Any], Any], value: Any) -> Any:
    """``value`` rebuilt with ``fn`` applied to each leaf."""
    named, spec = flatten(value)
    return unflatten(spec, [fn(x) for _, x in named])


def map_tensors(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    """``value`` with ``fn`` applied to each tensor leaf (other leaves kept)."""
    return map_leaves(lambda x: fn(x) if isinstance(x, torch.Tensor) else x, value)


def label(path: str) -> str:
    """How an output leaf is named in a report: ``logits``, ``cache.layers[0].keys``,
    ``output[1]`` (a tuple's second element), ``output`` (a bare tensor)."""
    return path if path and not path.startswith("[") else f"output{path}"


class FlatModule(torch.nn.Module):
    """``model`` taking its inputs' tensor leaves and returning its outputs' tensor leaves, so that
    tracers that know only pytree nodes (``torch.export``) see any input/output structure."""

    def __init__(self, model: torch.nn.Module, inputs: tuple) -> None:
        super().__init__()
        self.model = model
        named, self._spec = flatten(tuple(inputs))
        self._fixed = [x for _, x in named]

    def flat_inputs(self) -> tuple[torch.Tensor, ...]:
        return tuple(x for x in self._fixed if isinstance(x, torch.Tensor))

    def forward(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        it = iter(tensors)
        args = unflatten(self._spec, [next(it) if isinstance(x, torch.Tensor) else x for x in self._fixed])
        return tensor_leaves(self.model(*args))
