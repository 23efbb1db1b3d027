"""Work kinds as code: the units a run hands its workers, and the one protocol each kind implements.

A *group* is what one worker takes at a time (an OpInfo x dtype, one ATen overload searched from
its schema, one model graph x dtype); an *item* is one result row inside it, named by an
:class:`ItemKey` that is stable across runs and processes (resume, merge and the gate rely on it).
A :class:`WorkKind` says which table its rows go to, which item variants it produces, how a run's
selection expands into its groups and how a worker runs one group. The kinds live next to their
code (:mod:`conformance.sweep`, :mod:`conformance.sweep.schema`, :mod:`conformance.models.runner`); the
list of them is :data:`conformance.run.kinds.KINDS`.

This module is a leaf: it imports nothing of the harness, so every layer may use it.

Example::

    >>> key = ItemKey.parse("abs|function|float32|3")
    >>> key.sample, key.group_key, str(key)
    (3, 'abs|float32', 'abs|function|float32|3')
    >>> Group("abs", "float32").key
    'abs|float32'
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol


@dataclass(frozen=True)
class ItemKey:
    """``name|variant|dtype|sample``: an OpInfo sample (variant function/inplace/out/backward/
    canary), a schema search (variant ``schema``, sample 0) or a model item (variant = mode
    eager/compile, sample 0). ``sample`` is an int; a gate finding that covers every sample of
    a group writes ``*`` there, which :meth:`parse` keeps as text."""

    name: str
    variant: str
    dtype: str
    sample: int | str = 0

    SEP: ClassVar[str] = "|"

    @classmethod
    def parse(cls, text: str) -> ItemKey:
        parts = text.split(cls.SEP)
        if len(parts) != 4 or not all(parts[:3]):
            raise ValueError(f"item key {text!r}: expected name|variant|dtype|sample")
        name, variant, dtype, sample = parts
        try:
            return cls(name, variant, dtype, int(sample))
        except ValueError:
            return cls(name, variant, dtype, sample)

    def __str__(self) -> str:
        return self.SEP.join((self.name, self.variant, self.dtype, str(self.sample)))

    @property
    def group_key(self) -> str:
        """The key of the group this item belongs to (:attr:`Group.key`)."""
        return f"{self.name}{self.SEP}{self.dtype}"

    def with_variant(self, variant: str) -> ItemKey:
        return ItemKey(self.name, variant, self.dtype, self.sample)


@dataclass(frozen=True)
class Group:
    """A unit of work a worker process takes: ``op`` (an OpInfo name, an ``aten::`` overload or
    a model id) x ``dtype`` (``any`` for a schema search), of work kind ``kind``."""

    op: str
    dtype: str
    kind: str = "opinfo"

    @property
    def key(self) -> str:
        return f"{self.op}{ItemKey.SEP}{self.dtype}"

    def item(self, variant: str, sample: int = 0) -> ItemKey:
        return ItemKey(self.op, variant, self.dtype, sample)


@dataclass(frozen=True)
class Skip:
    """Which items of a group a worker leaves out, sent with the group.

    ``done``: recorded already (resume) or seen in this group before a worker restart.
    ``only``: when set, every item outside it is left out too (re-running chosen items).
    ``crash_safe``: the CPU reference killed a worker during this group; a kind that can (the
    schema search) pre-flights each input in a forked child.
    ``replay``: what earlier runs stored for this group, to replay before searching (the schema
    search's corpus entry, a ``schema_corpus`` row); None: nothing stored, or the corpus is off.
    ``batch``: False once a compiled batch of this group's samples killed or hung a worker
    (:mod:`conformance.check.batching`): its items then compile one at a time.
    ``failed``: those of ``done`` whose recorded status failed (a kind whose walk depends on
    what it found, the size ladder, takes the same steps on a resume).
    """

    done: frozenset[str] = frozenset()
    only: frozenset[str] | None = None
    crash_safe: bool = False
    batch: bool = True
    replay: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    failed: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __contains__(self, key: object) -> bool:
        key = str(key)
        return key in self.done or (self.only is not None and key not in self.only)


NOTHING = Skip()


@dataclass(frozen=True)
class Selection:
    """What a run asks for, as the work kinds read it (a run spec's selection fields)."""

    # OpInfo globs; ``aten::`` globs select schema searches, globs of another namespace
    # (``neuron::*``) a target's custom ops
    ops: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    opinfo: bool = True
    schema: bool = False
    models: tuple[str, ...] = ()
    model_limit: int | None = None
    # the OpInfo variants asked for (empty: every one); a kind plans a group only for some (the
    # dtype probe's groups of dtypes an OpInfo does not claim: conformance.sweep.dtypes)
    variants: tuple[str, ...] = ()
    # causal LMs the generation lane decodes with (conformance.generate.lms.select: hf, hf@K/N, ids)
    generate: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # custom-op globs alone select no OpInfo (as aten:: globs alone select none)
        if self.custom_globs and not self.info_globs:
            object.__setattr__(self, "opinfo", False)

    @property
    def aten_globs(self) -> list[str]:
        return [g for g in self.ops if g.startswith("aten::")]

    @property
    def custom_globs(self) -> list[str]:
        return [g for g in self.ops if "::" in g and not g.startswith("aten::")]

    @property
    def info_globs(self) -> list[str]:
        return [g for g in self.ops if "::" not in g]


Row = dict[str, Any]


class WorkKind(Protocol):
    """One kind of work. To add one: implement this next to its code, add it to
    :data:`conformance.run.kinds.KINDS`; the run, resume, re-runs and the gate then handle it."""

    name: str  # Group.kind
    table: str  # the opdb table its rows go to
    variants: tuple[str, ...]  # ItemKey.variant values its items use (re-runs find the kind by them)
    # 0: a worker death during an item is that item's crash (or the CPU reference's). Above 0:
    # the kind can re-run a group crash-safe (each input pre-flighted in a forked child) after
    # such a death, with this many times the item timeout per item (Skip.crash_safe)
    crash_safe_factor: int
    # an item's time limit is this many times the run's item timeout (a model item builds, traces and
    # trains a whole graph on both sides; 1 for the op kinds, whose item is one call)
    timeout_factor: int

    def groups(self, selection: Selection) -> list[Group]:
        """The groups this kind contributes to a run, in a stable order (empty: none)."""
        ...

    def run(self, target: Any, group: Group, config: Any, *, skip: Container[str] = NOTHING,
            on_start: Callable[[str], None] | None = None) -> Iterator[Row]:
        """Run one group in a worker: ``on_start(key)`` before each item, then yield its row."""
        ...

    def synthetic_row(self, key: ItemKey) -> Row:
        """The identifying columns of a row the supervisor writes for an item that produced
        none (its worker crashed or timed out)."""
        ...

