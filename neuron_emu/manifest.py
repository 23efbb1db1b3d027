"""Neuron SDK build manifests: TOML schema, loading, inheritance and validation.

A manifest describes what one SDK build does: which ATen overloads have native kernels, how
unsupported dtypes are treated, the build's numerics and its known bugs ("defects").  Loading
validates everything into frozen dataclasses; any problem raises :class:`ManifestError` naming the
file, the key and the bad value, and saying what would be accepted.

Example::

    >>> from neuron_emu.manifest import load_build
    >>> b = load_build("2.32.0")
    >>> b.name, b.numerics.sin_range_reduction
    ('2.32.0', True)

Defects (``[[defects]]``: ``op`` glob on "aten::name.overload", optional ``dtypes``, ``min_numel``,
``probability``, ``magnitude``, ``note``) come in these kinds:

* ``wrong_result``     -- floating outputs scaled by ``1 + magnitude`` (integers +1, bools negated);
* ``nan``              -- outputs filled with NaN (integers with their minimum);
* ``wrong_dtype``      -- outputs returned in another dtype;
* ``error`` / ``crash`` / ``hang`` -- the call raises / aborts the process / never returns;
* ``fallback``         -- the call runs on the CPU fallback (counted and warned as one);
* ``wrong_strides``    -- right values (bitwise), another memory layout for the functional (fresh)
  outputs: one with >= 2 dims of size > 1 comes back in another dense dim order (e.g. column-major),
  any other with another storage offset;
* ``view_as_copy``     -- a view op returns a contiguous copy in new storage instead of a view.  It
  must name a view overload (one returning an alias of an input, e.g. 'aten::transpose.int',
  'aten::permute.default'); view ops are otherwise device infrastructure that no defect reaches;
* ``out_reallocates``  -- an ``out=`` overload (e.g. 'aten::add.out') gives its out tensors new storage
  even when their shape fits (right values, another ``data_ptr()``); it must name an out= overload;
* ``accepts_invalid``  -- where the CPU kernel raises, the call returns garbage instead: zeros shaped
  like the first tensor input, or the out tensors zeroed for an out= overload;
* ``nondeterministic`` -- every second call of the op nudges each finite floating output element by
  one ULP (integer and bool outputs unchanged): repeated calls differ, within any tolerance;
* ``noncontiguous_wrong`` -- like ``wrong_result``, but only when an input tensor (not an out=
  argument) is non-contiguous; contiguous inputs give right values;
* ``slow``             -- a performance regression: the call takes ``magnitude`` times as long (a
  required factor in (1, 100], e.g. 1.3, 2, 5).  The device does proportional extra work -- it
  times the call and then busy-works on the CPU until ``magnitude`` x that time has passed -- and
  nothing else changes: same routing (a zero-copy native or fallback op stays one), same values
  (bitwise), same native/fallback counts.  It fires on every matching call (``probability`` < 1 is
  refused); ``dtypes`` and ``min_numel`` filter as for the other kinds; several slow defects on one
  call multiply their factors.  Infrastructure ops (allocation, copies, views) are never slowed.

A defect's ``op`` may name one of the backend's own custom ops (``neuron::``, a glob over
:data:`~neuron_emu.defect_targets.CUSTOM_OPS`: ``neuron::rms_norm.default``, ``neuron::rope.default``,
``neuron::flash_attention.default`` and the ``*_backward`` ops their autograd calls; see
:mod:`neuron_emu.custom_ops`), with any kind above but ``view_as_copy`` and ``out_reallocates``,
or with one of the kinds that only a custom op takes (refused for an ATen op):

* ``wrong_fake_shape`` -- the op's fake (meta) implementation returns its outputs with the last dim
  one larger, while the device kernel is right (what torch.compile and opcheck's fake test meet);
* ``wrong_fake_dtype`` -- the fake implementation returns another dtype (float32 for a bfloat16 or
  float16 output, float16 for a float32 one);
* ``wrong_backward``   -- the forward is right, the gradients (the outputs of the op's backward op)
  are scaled by ``1 + magnitude``; it must name a differentiable op (not a ``*_backward`` one).

``[runtime]`` says how the device's runtime behaves: ``recover_errors`` (default true, as on the
real device) re-runs an op whose device execution fails (an ``error`` defect, a dtype or layout
rule of 'error', a kernel that raises) on the CPU, counted and warned as a fallback; the
environment variable :data:`FALLBACK_ONLY_ENV` set to 1 turns that off for the process (the real
``TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS`` with the emulator's prefix). ``crash`` and
``hang`` defects are never recovered.

``[distributed]`` is for the c10d backend (:mod:`neuron_emu.distributed`): ``reduce_accumulate`` =
``"fp32"`` (default: bfloat16/float16 reductions accumulate in float32, rounding once) or ``"native"``
(in their own dtype, rounding after each step in rank order: a lossy bf16 all-reduce).

A defect's ``op`` may name a collective, ``c10d::<torch.distributed function>`` (a glob over
:data:`C10D_COLLECTIVES`, e.g. ``'c10d::all_reduce'``; 2.13's ``all_gather_single`` and
``reduce_scatter_single`` are the ``*_into_tensor``/``*_tensor`` ones), with a kind of
:data:`C10D_DEFECT_KINDS`: ``wrong_result``/``nan`` on the outputs, ``error`` raises on every rank,
``crash``/``hang`` take the group's last rank (the caller for send/recv) while the others block in
the transport.  ``dtypes``, ``min_numel`` (largest tensor on any rank) and ``probability`` (rolled
alike on all ranks) apply; ``world_sizes`` (integers >= 1, c10d defects only) limits group sizes.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .defect_targets import CUSTOM_ONLY_KINDS, is_custom, kind_problem, op_traits  # noqa: F401  (op_traits: re-exported)

BUILDS_DIR = Path(__file__).with_name("builds")

DTYPE_RULES: dict[str, tuple[str, ...]] = {
    "float64": ("native", "downcast", "fallback", "error"),
    "int64": ("native", "narrow", "fallback", "error"),
    "complex": ("native", "fallback", "error"),
    "channels_last": ("native", "fallback", "error"),
    "sparse": ("native", "error"),  # sparse layouts (COO, CSR/CSC/BSR/BSC) on the device
}
_RULE_ALIASES = {"narrow": "downcast", "downcast": "downcast"}
DEFECT_KINDS = (
    "wrong_result", "nan", "wrong_dtype", "error", "crash", "hang", "fallback",
    # Contract defects: the values are right (or within tolerance) but a contract of the op is not.
    "wrong_strides", "view_as_copy", "out_reallocates", "accepts_invalid", "nondeterministic",
    "noncontiguous_wrong",
    # Performance defects: right values and contracts, more time.
    "slow",
    # Only the backend's custom ops (neuron::): a wrong fake implementation, wrong gradients.
    *CUSTOM_ONLY_KINDS,
)
DTYPE_NAMES = (
    "float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool",
    "complex64", "complex128",
)
MATMUL_INPUTS = ("fp32", "bf16", "fp16")
MAX_MAGNITUDE = 1000.0
MAX_SLOWDOWN = 100.0   # a `slow` defect's magnitude: a time factor in (1, MAX_SLOWDOWN]
ROUNDING = ("rne", "stochastic")
#: The torch.distributed functions a ``c10d::`` defect glob may name (see the module docstring).
C10D_COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_coalesced", "all_gather_into_tensor",
    "all_gather_single", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "broadcast",
    "all_to_all_single", "all_to_all", "send", "recv", "barrier", "reduce", "gather", "scatter",
)
#: torch 2.13's new names of collectives (alias -> the name above it stands for): a defect on either
#: name acts on the collective, however it is called.
C10D_ALIASES = {"all_gather_single": "all_gather_into_tensor", "reduce_scatter_single": "reduce_scatter_tensor"}
C10D_PREFIX = "c10d::"
#: The defect kinds that apply to a collective (``c10d::`` op).
C10D_DEFECT_KINDS = ("wrong_result", "nan", "error", "crash", "hang")
#: ``[distributed] reduce_accumulate``: how bfloat16/float16 reductions accumulate.
REDUCE_ACCUMULATE = ("fp32", "native")


#: Set to 1 (true, yes, on), a failed device execution raises instead of being recovered on the
#: CPU: the real device's TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS, with our prefix.
FALLBACK_ONLY_ENV = "NEURON_EMU_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS"


class ManifestError(ValueError):
    """A build manifest is malformed; the message names file, key, value and what is accepted."""


@dataclass(frozen=True)
class DtypeRules:
    float64: str = "downcast"
    int64: str = "downcast"       # "narrow" is stored as "downcast"
    complex: str = "fallback"
    channels_last: str = "error"
    sparse: str = "error"


@dataclass(frozen=True)
class Numerics:
    matmul_inputs: str = "fp32"
    transcendental_bits: int = 23
    sin_range_reduction: bool = True
    flush_denormals: bool = False
    rounding: str = "rne"


@dataclass(frozen=True)
class Runtime:
    recover_errors: bool = True  # a failed device execution is re-run on the CPU (see the module doc)


@dataclass(frozen=True)
class Distributed:
    reduce_accumulate: str = "fp32"   # "native": bf16/fp16 reductions accumulate in their own dtype


@dataclass(frozen=True)
class Defect:
    op: str
    kind: str
    dtypes: tuple[str, ...] | None = None
    min_numel: int = 0
    magnitude: float = 0.05
    probability: float = 1.0
    note: str = ""
    source: str = ""            # "<file>:defects[i]" for messages
    world_sizes: tuple[int, ...] | None = None   # c10d defects only: the group sizes it fires for

    def matches_name(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.op)

    @property
    def is_c10d(self) -> bool:
        """Whether this defect names a collective ("c10d::<torch.distributed function>")."""
        return self.op.startswith(C10D_PREFIX)


@dataclass(frozen=True)
class Build:
    name: str
    path: Path
    inherits: str | None
    native: tuple[str, ...]
    cpu_fallback: tuple[str, ...]
    dtypes: DtypeRules
    numerics: Numerics
    defects: tuple[Defect, ...]
    description: str = ""
    release: bool = True   # False: a control build (e.g. "ideal"), not an SDK release
    runtime: Runtime = field(default_factory=Runtime)
    distributed: Distributed = field(default_factory=Distributed)
    _cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def is_native(self, op_name: str) -> bool:
        """Whether `op_name` ("aten::name.overload") has a native kernel in this build (the
        backend's own custom ops, "neuron::...", always have: they exist only on the device)."""
        if is_custom(op_name):
            return True
        hit = self._cache.get(op_name)
        if hit is None:
            hit = bool(_regex(self.native).match(op_name)) and not _regex(self.cpu_fallback).match(op_name)
            self._cache[op_name] = hit
        return hit

    def native_overloads(self) -> list[str]:
        """Every registered ATen overload this build runs natively."""
        return [n for n in aten_overloads() if self.is_native(n)]


@functools.lru_cache(maxsize=256)
def _regex(globs: tuple[str, ...]) -> re.Pattern:
    if not globs:
        return re.compile(r"(?!x)x")
    return re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs))


@functools.lru_cache(maxsize=1)
def aten_overloads() -> tuple[str, ...]:
    """All registered ATen overloads, spelled "aten::name.overload" ("default" when unnamed)."""
    import torch

    out = []
    for n in torch._C._dispatch_get_all_op_names():
        if not n.startswith("aten::"):
            continue
        out.append(n if "." in n else n + ".default")
    return tuple(sorted(out))


def _is_release(path: Path) -> bool:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8")).get("build", {}).get("release", True) is not False
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        return True  # load_build reports what is wrong with it


def _version_key(name: str) -> tuple:
    return tuple((0, int(x), "") if x.isdigit() else (1, 0, x) for x in re.split(r"[.\-]", name))


def shipped_builds(include_controls: bool = False) -> list[str]:
    """Names of the SDK release builds shipped in ``neuron_emu/builds`` (oldest first).

    Control builds (``release = false`` in ``[build]``, e.g. ``ideal``: every op native, no
    numerics, dtype rules or defects) are not releases: they are listed, after the releases, only
    with `include_controls`; :func:`load_build` loads them by name either way.
    """
    paths = sorted(BUILDS_DIR.glob("*.toml"), key=lambda p: _version_key(p.stem))
    names = [p.stem for p in paths if _is_release(p)]
    if include_controls:
        names += sorted(p.stem for p in paths if not _is_release(p))
    return names


def control_builds() -> list[str]:
    """Names of the shipped control builds (``release = false``), e.g. ``["ideal"]``."""
    return [n for n in shipped_builds(include_controls=True) if n not in shipped_builds()]


def default_build_name() -> str:
    return shipped_builds()[-1]


def _err(path: Path, key: str, value: Any, accepted: str) -> ManifestError:
    return ManifestError(f"{path}: invalid manifest key '{key}' = {value!r}: expected {accepted}")


_TOP_KEYS = {"build", "ops", "dtypes", "numerics", "defects", "runtime", "distributed"}
_RUNTIME_KEYS = {"recover_errors": bool}
_DIST_KEYS = {"reduce_accumulate": str}
_BUILD_KEYS = {"name": str, "inherits": str, "description": str, "reset_defects": bool, "release": bool}
_OPS_KEYS = {"native", "cpu_fallback"}
_NUM_KEYS = {
    "matmul_inputs": str, "transcendental_bits": int, "sin_range_reduction": bool,
    "flush_denormals": bool, "rounding": str,
}
_DEFECT_KEYS = {
    "op": str, "dtypes": list, "min_numel": int, "kind": str, "magnitude": (int, float),
    "probability": (int, float), "note": str, "world_sizes": list,
}


def _check_type(path, key, value, typ, accepted):
    ok = isinstance(value, typ) and not (typ in (int, (int, float)) and isinstance(value, bool))
    if typ is int and isinstance(value, bool):
        ok = False
    if not ok:
        raise _err(path, key, value, accepted)


def _check_keys(path, prefix, table, allowed):
    if not isinstance(table, dict):
        raise _err(path, prefix, table, f"a table with keys {sorted(allowed)}")
    for k in table:
        if k not in allowed:
            raise _err(path, f"{prefix}.{k}" if prefix else k, table[k],
                       f"one of the known keys {sorted(allowed)} (unknown key)")


def _check_glob(path, key, glob):
    if not isinstance(glob, str):
        raise _err(path, key, glob, "a string glob such as 'aten::add.Tensor' or 'aten::mm.*'")
    rx = _regex((glob,))
    if not any(rx.match(n) for n in aten_overloads()):
        raise _err(path, key, glob,
                   "an fnmatch glob matching at least one registered ATen overload "
                   "(spelled 'aten::name.overload', '.default' when unnamed, e.g. 'aten::add.Tensor', "
                   "'aten::mm.*'); this one matches nothing")


def _check_c10d_glob(path, key, glob):
    names = [C10D_PREFIX + n for n in C10D_COLLECTIVES]
    if not any(fnmatch.fnmatchcase(n, glob) for n in names):
        raise _err(path, key, glob,
                   "a 'c10d::' fnmatch glob matching at least one of the collectives "
                   f"{', '.join(names)}; this one matches none")


def _check_world_sizes(path, key, value, c10d):
    if not c10d:
        raise _err(path, key, value, "no 'world_sizes' key: it restricts only defects on collectives "
                                     "(an op 'c10d::<torch.distributed function>'), and this one does not")
    if not value or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise _err(path, key, value, "a non-empty list of integers >= 1 (the process group sizes the defect fires for)")


def _check_kind_target(path, key, glob, kind):
    """The defect's op glob names an op that `kind` can act on (see :func:`.defect_targets.kind_problem`)."""
    problem = kind_problem(glob, kind, aten_overloads())
    if problem is not None:
        where, accepted = problem
        raise _err(path, f"{key}.{where}", glob if where == "op" else kind, accepted)


def _slow_factor(path: Path, key: str, d: dict) -> float:
    """A ``slow`` defect's magnitude (its time factor), checked; it fires on every matching call."""
    if "magnitude" not in d:
        raise _err(path, f"{key}.magnitude", None,
                   f"for kind 'slow', a time factor > 1 and <= {MAX_SLOWDOWN:g} (required key: the call "
                   "takes magnitude times as long, e.g. 1.3, 2, 5)")
    mag = float(d["magnitude"])
    if not (math.isfinite(mag) and 1.0 < mag <= MAX_SLOWDOWN):
        raise _err(path, f"{key}.magnitude", d["magnitude"],
                   f"for kind 'slow', a finite time factor > 1 and <= {MAX_SLOWDOWN:g} (the call takes "
                   "magnitude times as long, e.g. 1.3, 2, 5)")
    if float(d.get("probability", 1.0)) < 1.0:
        raise _err(path, f"{key}.probability", d["probability"],
                   "for kind 'slow', 1 (or no probability key): a slow defect fires on every matching call")
    return mag


def _resolve(ref: str, relative_to: Path | None) -> Path:
    p = Path(ref)
    if ref.endswith(".toml") or "/" in ref or "\\" in ref:
        if not p.is_absolute() and relative_to is not None:
            p = relative_to / p
        return p.resolve()
    return (BUILDS_DIR / f"{ref}.toml").resolve()


def load_build(ref: str | Path) -> Build:
    """Loads and validates a build by shipped name ("2.33.0") or by path to a .toml file."""
    path = _resolve(str(ref), Path.cwd())
    if not path.exists():
        raise ManifestError(
            f"{path}: no such build manifest for {str(ref)!r}; expected one of the shipped builds "
            f"{shipped_builds()} or a path to a .toml file")
    return _load(path, ())


def _load(path: Path, stack: tuple[Path, ...]) -> Build:
    if path in stack:
        chain = " -> ".join(str(p) for p in (*stack, path))
        raise ManifestError(f"{stack[-1]}: invalid manifest key 'build.inherits' = {path.stem!r}: "
                            f"expected an acyclic inheritance chain, found a cycle {chain}")
    if path.is_dir():
        raise ManifestError(f"{path}: is a directory; expected a build manifest .toml file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"{path}: not a UTF-8 text file (byte {e.start}: {e.reason}); "
                            "expected a build manifest in UTF-8 TOML") from None
    except OSError as e:
        raise ManifestError(f"{path}: cannot be read ({e.strerror}); expected a build manifest .toml file") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ManifestError(f"{path}: invalid TOML ({e}); expected a build manifest") from None
    _check_keys(path, "", data, _TOP_KEYS)
    build = data.get("build")
    if build is None:
        raise _err(path, "build", None, "a [build] table with at least 'name'")
    _check_keys(path, "build", build, set(_BUILD_KEYS))
    for k, t in _BUILD_KEYS.items():
        if k in build:
            _check_type(path, f"build.{k}", build[k], t, f"a {t.__name__}")
    if "name" not in build or not build["name"].strip():
        raise _err(path, "build.name", build.get("name"), "a non-empty string naming the build, e.g. '2.33.0'")

    parent: Build | None = None
    if "inherits" in build:
        ppath = _resolve(build["inherits"], path.parent)
        if not ppath.exists():
            raise _err(path, "build.inherits", build["inherits"],
                       f"a shipped build name {shipped_builds()} or a path relative to {path.parent}")
        parent = _load(ppath, (*stack, path))

    ops = data.get("ops", {})
    _check_keys(path, "ops", ops, _OPS_KEYS)
    lists = {}
    for k in _OPS_KEYS:
        vals = ops.get(k, [])
        if not isinstance(vals, list):
            raise _err(path, f"ops.{k}", vals, "a list of op globs")
        for i, g in enumerate(vals):
            _check_glob(path, f"ops.{k}[{i}]", g)
        lists[k] = (getattr(parent, k) if parent else ()) + tuple(vals)

    dt = data.get("dtypes", {})
    _check_keys(path, "dtypes", dt, set(DTYPE_RULES))
    rules = dict(parent.dtypes.__dict__) if parent else dict(DtypeRules().__dict__)
    for k, v in dt.items():
        if not isinstance(v, str) or v not in DTYPE_RULES[k]:
            raise _err(path, f"dtypes.{k}", v, "one of " + ", ".join(repr(x) for x in DTYPE_RULES[k]))
        rules[k] = _RULE_ALIASES.get(v, v)

    num = data.get("numerics", {})
    _check_keys(path, "numerics", num, set(_NUM_KEYS))
    nvals = dict(parent.numerics.__dict__) if parent else dict(Numerics().__dict__)
    for k, v in num.items():
        t = _NUM_KEYS[k]
        _check_type(path, f"numerics.{k}", v, t, f"a {t.__name__}")
        nvals[k] = v
    if nvals["matmul_inputs"] not in MATMUL_INPUTS:
        raise _err(path, "numerics.matmul_inputs", nvals["matmul_inputs"], f"one of {list(MATMUL_INPUTS)}")
    if nvals["rounding"] not in ROUNDING:
        raise _err(path, "numerics.rounding", nvals["rounding"], f"one of {list(ROUNDING)}")
    if not 1 <= nvals["transcendental_bits"] <= 23:
        raise _err(path, "numerics.transcendental_bits", nvals["transcendental_bits"],
                   "an integer number of float32 mantissa bits in 1..23")

    rt = data.get("runtime", {})
    _check_keys(path, "runtime", rt, set(_RUNTIME_KEYS))
    rvals = dict(parent.runtime.__dict__) if parent else dict(Runtime().__dict__)
    for k, v in rt.items():
        _check_type(path, f"runtime.{k}", v, _RUNTIME_KEYS[k], "true or false")
        rvals[k] = v

    dsec = data.get("distributed", {})
    _check_keys(path, "distributed", dsec, set(_DIST_KEYS))
    dvals = dict(parent.distributed.__dict__) if parent else dict(Distributed().__dict__)
    for k, v in dsec.items():
        if not isinstance(v, str) or v not in REDUCE_ACCUMULATE:
            raise _err(path, f"distributed.{k}", v,
                       "one of " + ", ".join(repr(x) for x in REDUCE_ACCUMULATE) +
                       " ('fp32': bfloat16/float16 reductions accumulate in float32 and round once; "
                       "'native': in their own dtype, rounding after each step)")
        dvals[k] = v

    raw_defects = data.get("defects", [])
    if not isinstance(raw_defects, list):
        raise _err(path, "defects", raw_defects, "an array of [[defects]] tables")
    defects = [] if (parent is None or build.get("reset_defects")) else list(parent.defects)
    for i, d in enumerate(raw_defects):
        key = f"defects[{i}]"
        _check_keys(path, key, d, set(_DEFECT_KEYS))
        for k, t in _DEFECT_KEYS.items():
            if k in d:
                _check_type(path, f"{key}.{k}", d[k], t,
                            "a number" if isinstance(t, tuple) else f"a {t.__name__}")
        for req in ("op", "kind"):
            if req not in d:
                raise _err(path, f"{key}.{req}", None, "a value (required key)")
        c10d = d["op"].startswith(C10D_PREFIX)
        if c10d:
            _check_c10d_glob(path, f"{key}.op", d["op"])
        elif not is_custom(d["op"]):  # a custom op's glob: checked with its kind below
            _check_glob(path, f"{key}.op", d["op"])
        if d["kind"] not in DEFECT_KINDS:
            raise _err(path, f"{key}.kind", d["kind"], "one of " + ", ".join(DEFECT_KINDS))
        if c10d and d["kind"] not in C10D_DEFECT_KINDS:
            raise _err(path, f"{key}.kind", d["kind"],
                       f"for a collective (op {d['op']!r}), one of " + ", ".join(C10D_DEFECT_KINDS))
        if not c10d:
            _check_kind_target(path, key, d["op"], d["kind"])
        if "world_sizes" in d:
            _check_world_sizes(path, f"{key}.world_sizes", d["world_sizes"], c10d)
        dts = d.get("dtypes")
        if dts is not None:
            for j, name in enumerate(dts):
                if name not in DTYPE_NAMES:
                    raise _err(path, f"{key}.dtypes[{j}]", name, "one of " + ", ".join(DTYPE_NAMES))
        prob = float(d.get("probability", 1.0))
        if not 0.0 < prob <= 1.0:
            raise _err(path, f"{key}.probability", d["probability"], "a number in (0, 1]")
        if int(d.get("min_numel", 0)) < 0:
            raise _err(path, f"{key}.min_numel", d["min_numel"], "a non-negative integer")
        if d["kind"] == "slow":
            mag = _slow_factor(path, key, d)
        else:
            mag = float(d.get("magnitude", 0.05))
            if not (math.isfinite(mag) and -1.0 <= mag <= MAX_MAGNITUDE):
                raise _err(path, f"{key}.magnitude", d["magnitude"],
                           f"a finite relative error in [-1, {MAX_MAGNITUDE:g}] (results are scaled by 1 + magnitude)")
        defects.append(Defect(
            op=d["op"], kind=d["kind"], dtypes=tuple(dts) if dts is not None else None,
            min_numel=int(d.get("min_numel", 0)), magnitude=mag,
            probability=prob, note=d.get("note", ""), source=f"{path.name}:{key}",
            world_sizes=tuple(d["world_sizes"]) if "world_sizes" in d else None,
        ))
    return Build(
        name=build["name"], path=path, inherits=build.get("inherits"),
        native=lists["native"], cpu_fallback=lists["cpu_fallback"],
        dtypes=DtypeRules(**rules), numerics=Numerics(**nvals), defects=tuple(defects),
        description=build.get("description", parent.description if parent else ""),
        release=build.get("release", True), runtime=Runtime(**rvals),
        distributed=Distributed(**dvals),
    )
