"""The nightly's spec (:class:`NightlySpec`) and the night's rotating slices: whose reference inputs,
which zoo architectures and which causal LMs the night's builds run, each chosen so that a stated
number of nights covers them all, and kept by a resumed nightly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from conformance.dist.lane import DistSpec
from conformance.models.selection import (
    ZOO,
    ZOO_INSTALL,
    ZOO_NIGHTLY_MODES,
    ZOO_NIGHTS,
    installed_libraries,
    parse_zoo_name,
)
from conformance.perf.lane import PerfSpec
from conformance.run.spec import RunSpec
from conformance.select import SelectionError, night_slice, parse_k_of_n, parse_reference_slice
from conformance.targets import BuildRef
from opdb import Store

Echo = Callable[[str], None]


@dataclass(frozen=True)
class NightlySpec:
    """A nightly: the run spec every build's sweep starts from, plus what only a nightly has."""

    run: RunSpec = RunSpec(models=("all",), schema=True, sizes="auto")  # its build and run id are set per build
    builds: tuple[BuildRef, ...] = ()  # default: every build the target ships, oldest first
    # the builds' run ids are ``{prefix}-{build}``: shards of one nightly share them, and a nightly
    # is resumed by its prefix (run_nightly picks one when none is given)
    run_id_prefix: str | None = None
    site: str | None = "results/site"
    gate: bool = True
    # the perf lane (conformance.perf): each build timed against the one before it, after the sweeps
    # (None: not run). Its build fields are set per pair.
    perf: PerfSpec | None = None
    # the distributed lane (conformance.dist) on every build after the sweeps (None: not run); its
    # build is set per build
    dist: DistSpec | None = None
    # whose reference_inputs every build's sweep runs (conformance.sweep.reference): None, the run
    # spec's own; "auto", the slice of the night the nightly started (select.night_slice: every
    # OpInfo within REFERENCE_NIGHTS nights; a resumed nightly keeps the slice its runs stored);
    # or none, all, K/N. `conformance nightly` asks for "auto"
    reference_inputs: str | None = None
    # which zoo architectures (conformance.models.selection: hf, timm, tv) every build runs besides
    # the run spec's models: None or "none", none; "auto", the night's slice of every zoo library
    # installed here (ZOO_NIGHTS nights cover the zoo; none installed: the nightly says so and runs
    # without it; a resumed nightly keeps the slice it started with); "all" or K/N, that slice, refused
    # when no zoo library is installed
    zoo: str | None = None
    # the generation lane's causal LMs every build decodes with (conformance.generate): None or "none",
    # none; "auto", the night's slice hf@K/GEN_NIGHTS (transformers missing: said, and run without);
    # "all" or K/N, that slice. A resumed nightly keeps the slice it started with; with --perf the
    # perf lane also times the slice's decode steps build against build
    generate: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "builds", tuple(BuildRef.parse(b) for b in self.builds))
        if self.reference_inputs not in (None, "auto"):
            object.__setattr__(self, "reference_inputs", parse_reference_slice(self.reference_inputs))
        if self.zoo not in (None, "auto", "none", "all"):
            parse_zoo_name(f"{ZOO}@{self.zoo}")  # K/N, or the error that names it
        if self.generate not in (None, "auto", "none", "all"):
            parse_k_of_n(str(self.generate), f"--generate {self.generate!r}", "auto, none, all or ")

    def run_for(self, build: BuildRef) -> RunSpec:
        run_id = f"{self.run_id_prefix}-{build}".replace("/", "_") if self.run_id_prefix else None
        return self.run.replace(build=build, run_id=run_id)


def default_builds(target: str) -> tuple[BuildRef, ...]:
    from conformance.targets import REGISTRY, get_target

    get_target("cpu")  # loads the registry
    cls = REGISTRY.get(target)
    builds = cls.available_builds() if cls is not None else ()
    return tuple(BuildRef(b) for b in builds) or (BuildRef(),)


def with_reference_slice(spec: NightlySpec, store: Store, resume: bool) -> NightlySpec:
    """The spec with its reference slice set in the run spec every build's sweep starts from (so it
    is stored with each build's run, and the builds of one night sweep the same slice): ``auto``
    is the slice of today's night, or, resumed, the one the nightly's first stored run has (a
    nightly resumed after midnight sweeps the slice it started with)."""
    chosen = spec.reference_inputs
    if chosen == "auto":
        builds = spec.builds or default_builds(spec.run.target)
        run = next((r for b in builds if (r := store.get_run(spec.run_for(b).run_id or "")) is not None), None) \
            if resume else None
        chosen = RunSpec.from_run(run, workers=spec.run.workers).reference_inputs if run else night_slice()
    if chosen is None:
        return spec
    return dataclasses.replace(spec, run=spec.run.replace(reference_inputs=chosen))


def with_zoo_slice(spec: NightlySpec, store: Store, resume: bool, echo: Echo = print) -> NightlySpec:
    """The spec with the night's zoo slice (``zoo@K/N``; ``zoo@0/1`` for all of it) added to the models
    every build runs (so each build's run stores it, and the builds of one night run the same
    architectures). ``auto``: the slice of today's night (:func:`night_slice` over ZOO_NIGHTS), or,
    resumed, the one the nightly's first stored run has; with no zoo library installed the nightly
    says so and runs without the zoo."""
    chosen = spec.zoo
    if chosen in (None, "none") or not spec.run.models:
        return spec
    if chosen == "auto" and resume:
        builds = spec.builds or default_builds(spec.run.target)
        run = next((r for b in builds if (r := store.get_run(spec.run_for(b).run_id or "")) is not None), None)
        stored = [m for m in (RunSpec.from_run(run, workers=spec.run.workers).models if run else ())
                  if (z := parse_zoo_name(m)) is not None and z[0] == ZOO]
        if run is not None:
            if not stored:
                return spec
            return dataclasses.replace(spec, run=spec.run.replace(models=(*spec.run.models, *stored),
                                                                  zoo_modes=ZOO_NIGHTLY_MODES))
    # the whole zoo is the slice 0/1: no --model-limit caps a slice
    part = "0/1" if chosen == "all" else night_slice(nights=ZOO_NIGHTS) if chosen == "auto" else chosen
    name = f"{ZOO}@{part}"
    installed = installed_libraries()
    if not installed:
        if chosen == "auto":
            echo(f"== zoo: no zoo library is installed ({ZOO_INSTALL}); the nightly runs without the zoo ==")
            return spec
        raise SelectionError(f"--zoo {chosen}: no zoo library is installed ({ZOO_INSTALL})")
    nights = int(part.split("/")[1])
    echo(f"== zoo: slice {part} of {', '.join(installed)} (every architecture within {nights} "
         f"{'night' if nights == 1 else 'nights'}) ==")
    return dataclasses.replace(spec, run=spec.run.replace(models=(*spec.run.models, name), zoo_modes=ZOO_NIGHTLY_MODES))


#: The nights the nightly's generation slice takes to cover every causal LM (``--generate auto``):
#: two of transformers' 200 a night, the full protocol each (2 dtypes x 2 modes x 4 buckets: about 3 minutes
#: a model on 2 loaded cores, README "Generation parity").
GEN_NIGHTS = 100


def with_generation_slice(spec: NightlySpec, store: Store, resume: bool, echo: Echo = print) -> NightlySpec:
    """The spec with the night's causal LMs (``hf@K/N``) for the generation lane (see NightlySpec.generate)."""
    from conformance.generate import lms

    chosen = spec.generate
    if chosen in (None, "none"):
        return spec
    if chosen == "auto" and resume:
        builds = spec.builds or default_builds(spec.run.target)
        run = next((r for b in builds if (r := store.get_run(spec.run_for(b).run_id or "")) is not None), None)
        if run is not None:
            return _generating(spec, RunSpec.from_run(run, workers=spec.run.workers).generate)
    part = "0/1" if chosen == "all" else night_slice(nights=GEN_NIGHTS) if chosen == "auto" else chosen
    if not lms.available():
        if chosen == "auto":
            echo("== generation: transformers is not installed (pip install -e '.[hf]'); the nightly runs without it ==")
            return spec
        raise SelectionError(f"--generate {chosen}: transformers is not installed (pip install -e '.[hf]')")
    nights = int(part.split("/")[1])
    echo(f"== generation: causal LMs hf@{part} (every one within {nights} {'night' if nights == 1 else 'nights'}) ==")
    return _generating(spec, (f"hf@{part}",))


def _generating(spec: NightlySpec, names: tuple[str, ...]) -> NightlySpec:
    perf = spec.perf
    if perf is not None and names and hasattr(perf, "decode"):
        perf = dataclasses.replace(perf, decode=names)
    return dataclasses.replace(spec, run=spec.run.replace(generate=names), perf=perf)
