"""The CPU side, computed once: reference results shared by the builds and targets of a nightly.

Every build of a nightly (and every target compared against the CPU) runs the same seeded samples
through the same CPU kernels; the CPU's result of a sample is the same each time. A
:class:`RefCache` keeps those results on disk (one SQLite file beside the results database, shared
by all workers) and in memory, so the second and third build of a nightly take them instead of
calling the op again.

- **Keyed by content.** An entry is found by a cheap *hint* (what the caller calls the item, e.g.
  ``opinfo|abs|function|float32|0|seed``) and is taken only when the *digest* of the sample's
  content matches the stored one: every tensor's bytes (its whole storage), dtype, shape, strides,
  offset and which arguments share storage, every other argument's ``repr``, the call's flags,
  and the environment (:func:`environment`: torch's version and git hash, intra-op threads, the
  harness's CPU-side code). A sample that changed, a new torch or a changed harness is a miss,
  and its entry is replaced. An argument that cannot be digested (an object whose ``repr`` is
  its address, a sparse tensor) makes the item uncacheable: it is computed as before.
- **Only what is worth it.** Looking up costs a digest of the sample; an entry is stored only when
  computing it took at least ``min_seconds`` and it is small enough to read back in much less
  time than that (:data:`BYTES_PER_SECOND`; a 20 MB grid sample that takes 30 ms is recomputed),
  so the cache holds the expensive references and a cheap op is never slowed down; a hint the
  file does not hold costs a set lookup.
- **Bounded.** In memory, at most ``memory_bytes`` of decoded results per process (least recently
  used out); on disk, at most ``disk_bytes`` (least recently used rows deleted). Entries of
  another environment are deleted when the file is opened.
- **Safe to lose.** The file is a cache: a worker killed mid-write loses at most its entry
  (SQLite's transaction), a damaged file is recreated, and ``--refcache none`` runs without one.

Values are pytrees of strided tensors, Python scalars, strings, ``None``, dtypes, tuples, lists,
dicts, ``torch.return_types`` and :class:`SampleInput`; tensors are stored as their raw storage
bytes (shared storages once, so aliasing survives a round trip).

Example::

    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> cache = RefCache(Path(tempfile.mkdtemp()) / "ref.sqlite", min_seconds=0)
    >>> x = torch.arange(6.0).reshape(2, 3)
    >>> digest = content_digest(("abs", x))
    >>> cache.get("abs|0", lambda: digest) is MISSING
    True
    >>> cache.put("abs|0", digest, (x.abs(), "ok"), seconds=0.01)
    >>> got, note = cache.get("abs|0", lambda: digest)
    >>> torch.equal(got, x.abs()), note
    (True, 'ok')
"""

from __future__ import annotations

import collections
import hashlib
import pickle
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from opdb.refstore import RefStore

from .compare import bitwise_equal, leaves

#: Stored entries are taken by a process whose environment string equals theirs.
CACHE_VERSION = 2  # 2: digests are SHA-256
MIN_SECONDS = 0.002  # an entry is stored only when computing it took this long ...
BYTES_PER_SECOND = 50e6  # ... and it holds at most this many bytes per second its computing took ...
MEMORY_BYTES = 256 << 20  # ... decoded results kept per process ...
DISK_BYTES = 2 << 30  # ... and bytes the file may hold

MISSING = object()


class Uncacheable(Exception):
    """The value or sample holds something the cache cannot store or digest faithfully."""


# -- digests ----------------------------------------------------------------------------------------
_PLAIN = (int, float, bool, complex, str, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format, slice, type(Ellipsis))


def content_digest(value: Any) -> str:
    """A digest of ``value``'s content: tensors by their bytes and layout (and which of them share
    storage), other leaves by ``repr``. Raises :class:`Uncacheable` for a leaf whose ``repr``
    would not say what it is (e.g. ``<object at 0x...>``) or a tensor that is not strided."""
    h = hashlib.sha256()  # hardware-accelerated where the CPU has SHA extensions: a 1.5x faster pass than blake2b's
    storages: dict[int, int] = {}
    _digest(value, h, storages)
    return h.hexdigest()


def _digest(v: Any, h: Any, storages: dict[int, int]) -> None:
    if isinstance(v, torch.Tensor):
        _plain_tensor(v)
        st = v.untyped_storage()
        ptr = st.data_ptr()
        first = ptr not in storages
        index = storages.setdefault(ptr, len(storages))
        h.update(f"T{v.dtype}{tuple(v.shape)}{v.stride()}{v.storage_offset()}s{index}g{int(v.requires_grad)}".encode())
        if first:
            h.update(_storage_view(v))
        return
    if isinstance(v, (list, tuple)):
        h.update(f"{type(v).__name__}[{len(v)}".encode())
        for x in v:
            _digest(x, h, storages)
        h.update(b"]")
        return
    if isinstance(v, dict):
        h.update(f"dict[{len(v)}".encode())
        for k, x in v.items():
            h.update(repr(k).encode())
            _digest(x, h, storages)
        h.update(b"]")
        return
    if hasattr(v, "input") and hasattr(v, "args") and hasattr(v, "kwargs"):  # a SampleInput
        h.update(b"sample(")
        _digest((v.input, tuple(v.args), dict(v.kwargs)), h, storages)
        h.update(b")")
        return
    if isinstance(v, torch.UntypedStorage):  # a Storage argument (set_'s): its repr says nothing of sharing
        raise Uncacheable("cannot digest a Storage argument")
    r = repr(v)
    if " at 0x" in r or len(r) > 10_000:
        raise Uncacheable(f"cannot digest {type(v).__name__}")
    h.update(f"{type(v).__name__}:{r};".encode())


def _plain_tensor(t: torch.Tensor) -> None:
    """Raise :class:`Uncacheable` unless ``t`` is a plain strided CPU tensor (what its storage's
    bytes and its layout describe in full)."""
    if t.layout != torch.strided or t.is_conj() or t.is_neg() or t.device.type != "cpu" or \
            type(t) not in (torch.Tensor, torch.nn.Parameter):
        raise Uncacheable(f"cannot store a {t.layout} {type(t).__name__} on {t.device}")


def _storage_view(t: torch.Tensor) -> Any:
    """The bytes of ``t``'s whole storage, without a copy (what a digest reads)."""
    st = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(st).numpy().data if st.nbytes() else b""


def _storage_bytes(t: torch.Tensor) -> bytes:
    return bytes(_storage_view(t))


def environment() -> str:
    """What a stored result depends on besides its sample: torch, the threads its kernels ran
    with, and the harness's own CPU-side code (how an item calls the op)."""
    src = Path(__file__).with_name("execute.py").read_bytes()  # how an item calls the op
    code = hashlib.blake2b(src, digest_size=8).hexdigest()
    return f"v{CACHE_VERSION} torch {torch.__version__} {torch.version.git_version} threads {torch.get_num_threads()} execute {code}"


# -- values -----------------------------------------------------------------------------------------
def encode(value: Any) -> bytes:
    """``value`` as bytes: its structure pickled with each tensor replaced by a reference to one
    of the stored storages (raw bytes), so that tensors sharing storage still do."""
    storages: dict[int, int] = {}
    blobs: list[bytes] = []

    def tensor(t: torch.Tensor) -> tuple[Any, ...]:
        _plain_tensor(t)
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in storages or st.nbytes() == 0:
            storages[ptr] = len(blobs)
            blobs.append(_storage_bytes(t))
        return ("T", storages[ptr], str(t.dtype).removeprefix("torch."), tuple(t.shape), t.stride(),
                t.storage_offset(), t.requires_grad)

    def walk(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return tensor(v)
        if type(v) in (list, tuple):
            return (type(v).__name__, [walk(x) for x in v])
        if isinstance(v, tuple) and hasattr(v, "n_fields"):  # torch.return_types
            return ("rt", type(v).__module__, type(v).__qualname__, [walk(x) for x in v])
        if type(v) is dict:
            return ("dict", [(k, walk(x)) for k, x in v.items()])
        if hasattr(v, "input") and hasattr(v, "args") and hasattr(v, "kwargs") and hasattr(v, "transform"):
            return ("sample", walk(v.input), walk(tuple(v.args)), walk(dict(v.kwargs)))
        if isinstance(v, _PLAIN):
            return ("v", v)
        raise Uncacheable(f"cannot store a {type(v).__name__}")

    tree = pickle.dumps(walk(value), protocol=pickle.HIGHEST_PROTOCOL)
    parts = [struct.pack("<II", len(tree), len(blobs)), tree]
    for b in blobs:
        parts += [struct.pack("<Q", len(b)), b]
    return b"".join(parts)


def decode(data: bytes) -> Any:
    n_tree, n_blobs = struct.unpack_from("<II", data, 0)
    pos = 8
    tree = pickle.loads(data[pos:pos + n_tree])
    pos += n_tree
    storages = []
    for _ in range(n_blobs):
        (size,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        buf = bytearray(data[pos:pos + size])
        pos += size
        storages.append(torch.frombuffer(buf, dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8))

    def walk(v: Any) -> Any:
        tag = v[0]
        if tag == "T":
            _, index, dtype, shape, stride, offset, grad = v
            raw = storages[index]
            dt = getattr(torch, dtype)
            base = raw.view(dt) if raw.numel() else torch.empty(0, dtype=dt)
            t = base.as_strided(shape, stride, offset)
            return t.requires_grad_(True) if grad else t
        if tag in ("list", "tuple"):
            items = [walk(x) for x in v[1]]
            return items if tag == "list" else tuple(items)
        if tag == "rt":
            import importlib

            cls: Any = importlib.import_module(v[1])
            for part in v[2].split("."):
                cls = getattr(cls, part)
            return cls([walk(x) for x in v[3]])
        if tag == "dict":
            return {k: walk(x) for k, x in v[1]}
        if tag == "sample":
            from torch.testing._internal.opinfo.core import SampleInput

            return SampleInput(walk(v[1]), args=walk(v[2]), kwargs=walk(v[3]))
        return v[1]

    return walk(tree)


# -- the cache --------------------------------------------------------------------------------------
class RefCache:
    """Reference results on disk and in memory, keyed by a hint and verified by a content digest."""

    def __init__(self, path: str | Path, *, min_seconds: float = MIN_SECONDS, memory_bytes: int = MEMORY_BYTES,
                 disk_bytes: int = DISK_BYTES) -> None:
        self.path = Path(path)
        self.min_seconds, self.memory_bytes, self.disk_bytes = min_seconds, memory_bytes, disk_bytes
        self.env = environment()
        self.hits = self.misses = self.stored = 0
        self._memory: collections.OrderedDict[str, tuple[str, Any, int]] = collections.OrderedDict()
        self._in_memory = 0
        self._store: RefStore | None = RefStore(self.path, env=self.env)
        self._hints = self._store.hints()
        self._disk = self._store.total_bytes()

    def get(self, hint: str, digest: Callable[[], str]) -> Any:
        """The stored value for ``hint`` if its digest equals ``digest()`` (called only when the
        hint is held), else :data:`MISSING`."""
        held = self._memory.get(hint)
        if held is None and hint not in self._hints:
            self.misses += 1
            return MISSING
        try:
            want = digest()
        except Uncacheable:
            self.misses += 1
            return MISSING
        if held is not None and held[0] == want:
            self._memory.move_to_end(hint)
            self.hits += 1
            return decode(held[1])
        assert self._store is not None
        row = self._store.get(hint)
        if row is None or row[0] != want:
            self.misses += 1
            return MISSING
        self._remember(hint, want, row[1])
        self.hits += 1
        return decode(row[1])

    def put(self, hint: str, digest: str, value: Any, *, seconds: float) -> None:
        """Store ``value`` (what computing ``hint``'s reference gave) when it took at least
        ``min_seconds`` and can be stored; anything else is silently not cached."""
        if seconds < self.min_seconds:
            return
        try:
            data = encode(value)
        except Uncacheable:
            return
        if len(data) > seconds * BYTES_PER_SECOND:
            return
        assert self._store is not None
        old = self._store.put(hint, digest, data, seconds=seconds)
        if old is None:  # busy beyond the timeout: it stays uncached
            return
        self._disk += len(data) - old
        self._hints.add(hint)
        self._remember(hint, digest, data)
        self.stored += 1
        if self._disk > self.disk_bytes:
            self._evict()

    def through(self, hint: str, digest: Callable[[], str], compute: Callable[[], Any],
                codec: tuple[Callable[[Any], Any], Callable[[Any], Any]] | None = None) -> Any:
        """What the cache holds for ``hint`` and ``digest()``, else ``compute()`` (stored when it
        took long enough); ``codec``: (value to stored, stored to value)."""
        got = self.get(hint, digest)
        if got is not MISSING:
            return codec[1](got) if codec else got
        t0 = time.perf_counter()
        value = compute()
        took = time.perf_counter() - t0
        if took >= self.min_seconds:  # before the digest: a cheap value costs none
            try:
                self.put(hint, digest(), codec[0](value) if codec else value, seconds=took)
            except Uncacheable:
                pass
        return value

    def _remember(self, hint: str, digest: str, data: bytes) -> None:
        if len(data) > self.memory_bytes // 4:
            return
        old = self._memory.pop(hint, None)
        if old is not None:
            self._in_memory -= old[2]
        self._memory[hint] = (digest, data, len(data))
        self._in_memory += len(data)
        while self._in_memory > self.memory_bytes and self._memory:
            _, (_, _, n) = self._memory.popitem(last=False)
            self._in_memory -= n

    def _evict(self) -> None:
        """Delete least recently used rows until the file holds at most 3/4 of ``disk_bytes``."""
        assert self._store is not None
        gone, self._disk = self._store.evict(self.disk_bytes * 3 // 4)
        self._hints.difference_update(gone)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


class SharedCpu:
    """One item's CPU-side values through the reference cache (computed when it has none)."""

    def __init__(self, refs: Any, hint: str | None, info: Any, variant: str, sample: Any, sized_out: bool) -> None:
        self.refs, self.hint = (refs, hint) if refs is not None and hint is not None else (None, None)
        self.what = (info.name, variant, sized_out, sample)
        self._digest: str | None = None

    def digest(self) -> str:
        if self._digest is None:
            self._digest = content_digest(self.what)
        return self._digest

    def get(self, part: str, compute: Callable[[], Any], codec: tuple[Callable[[Any], Any], Callable[[Any], Any]]
            | None = None) -> Any:
        """``compute()``, or what the cache holds for it; ``codec``: (to stored, from stored)."""
        if self.refs is None:
            return compute()
        return self.refs.through(f"{self.hint}|{part}", self.digest, compute, codec)


_SAME = "unchanged by the call"


def unchanged_sample(sample: Any, fresh: Callable[[], Any]) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """How the CPU side's (result, sample after the call, error) is stored: the sample after the
    call only where the call changed it (most calls do not: the stored entry is half the size),
    else a marker, and ``fresh()`` (a new copy of ``sample``) when read back."""
    def to_stored(value: Any) -> Any:
        result, after, error = value
        if after is not None and not _shares_storage(result, after) and _bitwise_same(after, sample):
            after = _SAME  # (a result that is a view of its input keeps the input with it)
        return result, after, error

    def from_stored(value: Any) -> Any:
        result, after, error = value
        return result, (fresh() if isinstance(after, str) and after == _SAME else after), error

    return to_stored, from_stored


def _shares_storage(a: Any, b: Any) -> bool:
    def ptrs(v: Any) -> set[int]:
        return {x.untyped_storage().data_ptr() for x in leaves(v)
                if isinstance(x, torch.Tensor) and x.layout == torch.strided and x.untyped_storage().nbytes()}

    return bool(ptrs(a) & ptrs((b.input, b.args, b.kwargs)))


def _bitwise_same(a: Any, b: Any) -> bool:
    la, lb = leaves((a.input, a.args, a.kwargs)), leaves((b.input, b.args, b.kwargs))
    return len(la) == len(lb) and all(
        (x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
         and x.storage_offset() == y.storage_offset() and bitwise_equal(x, y))
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else
        (not isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor))
        for x, y in zip(la, lb, strict=True))


_OPEN: dict[str, RefCache] = {}


def open_cache(path: str | Path | None) -> RefCache | None:
    """The process's cache for ``path`` (one per file per process; None when ``path`` is None)."""
    if path is None:
        return None
    key = str(path)
    if key not in _OPEN:
        _OPEN[key] = RefCache(path)
    return _OPEN[key]


__all__ = ["RefCache", "SharedCpu", "unchanged_sample", "open_cache", "content_digest", "encode", "decode", "environment", "MISSING", "Uncacheable",
           "MIN_SECONDS", "BYTES_PER_SECOND", "MEMORY_BYTES", "DISK_BYTES"]
