"""Hints from the CPU reference's own error messages: what it asked for (tensor ranks, dtypes,
per-argument dtypes/shapes/ranks, the values a string argument takes) when it rejected a generated call. A schema search that found
no valid input is steered by them (:mod:`conformance.sweep.schema`). Learned from the reference
kernel only, never from the target.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

_DTYPE_WORDS = {
    "float": torch.float32, "float32": torch.float32, "double": torch.float64, "float64": torch.float64,
    "half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16, "long": torch.int64,
    "int64": torch.int64, "int": torch.int32, "int32": torch.int32, "short": torch.int16, "char": torch.int8,
    "byte": torch.uint8, "kbyte": torch.uint8, "uint8": torch.uint8, "bool": torch.bool,
    "complexfloat": torch.complex64, "complex64": torch.complex64, "quint8": torch.quint8,
    "qint8": torch.qint8, "qint32": torch.qint32,
}
_WORD_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}
_RANK_PATTERNS = (
    re.compile(r"\b([1-5])[- ]?d\b"),  # 3D, 3-D, 3d
    re.compile(r"\b([1-5]) or [1-5][- ]?d\b"),  # "2 or 3d": the first one
    re.compile(r"\b([1-5]) dims?\b"), re.compile(r"\bdimension ([1-5])\b"), re.compile(r"\bequals to ([1-5])\b"),
    re.compile(r"\b([1-5])-dimensional\b"), re.compile(r"dim\(\) == ([1-5])"),
)
_AT_LEAST = re.compile(r"at least (?:an? )?(\w+)[- ]dim|dim\(\) (>=?) ?([0-5])|at least (\w+) dimensions")
_WANT_DTYPE = (
    re.compile(r"(?:scalar type|dtype|to be of type|to be) (\w+)"), re.compile(r"but expected (\w+)"),
    re.compile(r"one of the following scalar types: ([\w, ]+)"), re.compile(r"expect \w+ to be (\w+)"),
)
_AVOID_DTYPE = re.compile(r"not implemented for '(\w+)'")
_ARG_DTYPE = (  # (argument name, dtype word)
    re.compile(r"'(\w+)' to have scalar type (\w+)"), re.compile(r"\b(\w+) must be (?:an? )?(int|integral|long|float|bool)\b"),
    re.compile(r"\b(out) tensor to have dtype (\w+)"),
)
_ARG_ONE_ELEMENT = re.compile(r"\b(\w+) must be a 1-element tensor")
# "reduce argument must be either add or multiply.": the values a string argument takes
_ARG_CHOICES = re.compile(r"\b(\w+) argument must be (?:either|one of):? ([\w ,']+?)\.?(?:$|[;)\n])")
_ARG_RANK = re.compile(r"\b(\w+) (?:has to be|should be|must be|to be) (?:an? )?(?:non-empty )?([1-5])[- ]?d\b", re.I)


@dataclass(frozen=True)
class Hints:
    """What the CPU reference's own error messages asked for (tensor ranks, dtypes), used to
    steer a further search after a first one found no valid input. Learned from the reference
    kernel, never from the target."""

    ranks: tuple[int, ...] = ()
    dtypes: tuple[torch.dtype, ...] = ()
    avoid: tuple[torch.dtype, ...] = ()
    arg_dtypes: tuple[tuple[str, torch.dtype], ...] = ()  # a named tensor argument's dtype
    arg_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # a named tensor argument's shape
    arg_ranks: tuple[tuple[str, int], ...] = ()  # a named tensor argument's rank
    arg_choices: tuple[tuple[str, tuple[str, ...]], ...] = ()  # a named string argument's values

    def __bool__(self) -> bool:
        return bool(self.ranks or self.dtypes or self.avoid or self.arg_dtypes or self.arg_shapes or self.arg_ranks
                    or self.arg_choices)

    def merge(self, other: Hints) -> Hints:
        def union(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(dict.fromkeys(a + b))

        return Hints(union(self.ranks, other.ranks), union(self.dtypes, other.dtypes), union(self.avoid, other.avoid),
                     tuple(dict(self.arg_dtypes + other.arg_dtypes).items()),
                     tuple(dict(self.arg_shapes + other.arg_shapes).items()),
                     tuple(dict(self.arg_ranks + other.arg_ranks).items()),
                     tuple(dict(self.arg_choices + other.arg_choices).items()))

    def describe(self) -> str:
        parts = []
        if self.ranks:
            parts.append("ranks " + ",".join(map(str, self.ranks)))
        if self.dtypes:
            parts.append("dtypes " + ",".join(str(d).removeprefix("torch.") for d in self.dtypes))
        if self.avoid:
            parts.append("avoiding " + ",".join(str(d).removeprefix("torch.") for d in self.avoid))
        parts += [f"{name}: {str(d).removeprefix('torch.')}" for name, d in self.arg_dtypes]
        parts += [f"{name}: shape {list(shape)}" for name, shape in self.arg_shapes]
        parts += [f"{name}: {rank}-D" for name, rank in self.arg_ranks]
        parts += [f"{name}: one of {', '.join(values)}" for name, values in self.arg_choices]
        return "; ".join(parts)


def hints_from_errors(messages: Iterable[str]) -> Hints:
    """Ranks and dtypes the CPU reference asked for in its rejections (what it *got* is ignored).

    >>> hints_from_errors(["Expected 3D or 4D tensor, but got: []"]).ranks
    (3, 4)
    >>> hints_from_errors(["Found dtype Long but expected Float"]).dtypes
    (torch.float32,)
    """
    ranks: list[int] = []
    want: list[torch.dtype] = []
    avoid: list[torch.dtype] = []
    arg_dtypes: dict[str, torch.dtype] = {}
    arg_shapes: dict[str, tuple[int, ...]] = {}
    arg_ranks: dict[str, int] = {}
    arg_choices: dict[str, tuple[str, ...]] = {}
    too_small = False
    for raw in messages:
        for name, values in _ARG_CHOICES.findall(raw):
            words = tuple(w.strip("' ") for w in re.split(r",| or ", values) if w.strip("' "))
            if words and all(w.isidentifier() for w in words):
                arg_choices.setdefault(name, words)
        for pat in _ARG_DTYPE:
            for name, word in pat.findall(raw):
                word = {"integral": "long"}.get(word.lower(), word.lower())
                if word in _DTYPE_WORDS:
                    arg_dtypes.setdefault(name, _DTYPE_WORDS[word])
        for name in _ARG_ONE_ELEMENT.findall(raw):
            arg_shapes.setdefault(name, (1,))
        for name, rank in _ARG_RANK.findall(raw):
            arg_ranks.setdefault(name.lower(), int(rank))
        for name in _AVOID_DTYPE.findall(raw):
            if name.lower() in _DTYPE_WORDS:
                avoid.append(_DTYPE_WORDS[name.lower()])
        msg = re.sub(r"\bgot\b[^;]*", "", raw.replace("\n", " ").lower())  # what the call had, not what it wanted
        msg = re.sub(r"not implemented for '\w+'|found (?:dtype )?\w+", "", msg)
        for pat in _RANK_PATTERNS:
            ranks.extend(int(x) for x in pat.findall(msg))
        for m in _AT_LEAST.finditer(msg):
            word = m.group(1) or m.group(4)
            if word:
                n = _WORD_NUMBERS.get(word, int(word) if word.isdigit() else 0)
            else:
                n = int(m.group(3)) + (m.group(2) == ">")
            ranks.extend(range(max(1, n), min(5, n + 1) + 1))
        if "no dimensions" in msg or "out of range" in msg or "0-dim" in msg:
            too_small = True
        if "matrix" in msg or "matrices" in msg:
            ranks.append(2)
        for pat in _WANT_DTYPE:
            for group in pat.findall(msg):
                for word in re.split(r"[, ]+", group):
                    if word in _DTYPE_WORDS:
                        want.append(_DTYPE_WORDS[word])
        if "complex" in msg:
            want.append(torch.complex64)
        if "qtensor" in msg or "quantiz" in msg:
            want += [torch.quint8, torch.qint8]
        if "int tensor" in msg or "integral" in msg or "integer" in msg:
            want.append(torch.int64)
            want.append(torch.int32)
        if "floating point" in msg or "float tensor" in msg:
            want.append(torch.float32)
    if too_small and not ranks:
        ranks = [2, 3, 4]
    want = [d for d in want if d not in avoid and d not in arg_dtypes.values()]
    return Hints(tuple(dict.fromkeys(sorted(ranks))), tuple(dict.fromkeys(want)), tuple(dict.fromkeys(avoid)),
                 tuple(arg_dtypes.items()), tuple(arg_shapes.items()), tuple(arg_ranks.items()),
                 tuple(arg_choices.items()))

