"""Hugging Face ``transformers`` architectures as model graphs (optional extra).

The architectures are the library's own: every model type of
``transformers.models.auto.modeling_auto.MODEL_MAPPING_NAMES`` (the base models), in the library's
order; model ids are ``hf.<model_type>``. Nothing is written by hand per architecture:

* the config is the config class's defaults (``CONFIG_MAPPING[model_type]()``), shrunk by rules
  over attribute names (:mod:`~conformance.models.hf.rules`: widths, layers, heads, feed-forward sizes, vocabulary,
  positions, image size, experts, per-stage lists elementwise, layer-indexed lists cut to the new
  depth), nested sub-configs (``text_config``, ``vision_config``, ``encoder``...) recursively;
  special token ids are renumbered into the top of the shrunk vocabulary; dropout off,
  ``use_cache`` off. Where the rules are not enough, ``conformance/data/hf_overrides.toml`` holds
  per-model-type overrides, each with its reason (:func:`~conformance.models.hf.rules.overrides`);
* the inputs come from the model's own declarations: ``main_input_name``, the required parameters
  of ``forward``, the config's image size, channels, mel bins and vocabulary; an encoder-decoder
  gets ``decoder_input_ids``;
* an architecture the library cannot give here (no base model, fails to build from the shrunk
  config, over the parameter budget, inputs that cannot be built) raises
  :class:`~conformance.models.zoo.ZooSkip` with the stage and the library's own text.

Weights are random and seeded; nothing is downloaded (``HF_HUB_OFFLINE=1``). The module wraps the
model so that it takes positional tensors and returns a tuple of float tensors.

Requires ``transformers`` (``pip install transformers``); without it :func:`available` is False
and selecting ``hf`` raises a ``SelectionError`` that says so.

Example::

    >>> from conformance.models import hf
    >>> if hf.available():
    ...     spec = hf.spec_by_id("hf.bert")
    ...     out = spec.build()(*spec.example_inputs())
    ...     type(out).__name__, len(spec.shape_variants())
    ... else:
    ...     ("tuple", 3)
    ('tuple', 3)
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import re
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..family import N_SHAPE_VARIANTS, float_leaves, pick, sumsq_loss
from ..tracing import Traceable
from ..zoo import ZooSkip, build_within_budget
from . import inputs
from .rules import apply_overrides, overrides, shrink

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
if importlib.util.find_spec("transformers") is not None:
    from .. import tvshim

    # transformers imports torchvision where it is installed (the zoo extra): the registry's build
    # cannot load its operators beside the CPU torch, so their schemas must exist first
    tvshim.ensure()

INSTALL_HINT = "install the hf extra: pip install transformers"


# -- the library ------------------------------------------------------------------------------
def available() -> bool:
    """Is ``transformers`` importable?"""
    return importlib.util.find_spec("transformers") is not None


def unavailable_reason() -> str:
    return f"Hugging Face transformers is not installed; {INSTALL_HINT}"


def _seed(*parts: Any) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


def base_models() -> dict[str, str]:
    """model type -> base model class name, in the library's order."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return {t: (c if isinstance(c, str) else c[0]) for t, c in MODEL_MAPPING_NAMES.items()}


class HFWrapper(nn.Module):
    """Positional tensors in (named ``names``), a tuple of the float output tensors out."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args: Tensor) -> tuple[Tensor, ...]:
        out = self.model(**dict(zip(self.names, args, strict=True)), return_dict=True)
        first = out.get("last_hidden_state", None) if hasattr(out, "get") else None
        leaves = [first] if isinstance(first, Tensor) else float_leaves(out.to_tuple())[:1]
        return tuple(leaves)


def _no_dropout(config: Any) -> None:
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in key or key.endswith("_pdrop") or "drop_prob" in key
                                         or key == "layerdrop" or key.endswith("_layerdrop")):
            setattr(config, key, 0.0)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):
            _no_dropout(value)


def _stage(stage: str, exc: BaseException) -> ZooSkip:
    return ZooSkip(f"{stage}: {type(exc).__name__}: {exc}"[:2000])


def _main_input(cls: Any) -> str:
    main = getattr(cls, "main_input_name", "input_ids")
    return main[0] if isinstance(main, list | tuple) else main  # OneFormer: pixels, then its task


def _mapped(model_type: str) -> Any:
    """What the base model mapping holds for ``model_type``: a class or a tuple of them."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    return MODEL_MAPPING[CONFIG_MAPPING[model_type]]


@functools.cache
def _model_class(model_type: str) -> Any:
    """The base model class (imports its modeling module; builds nothing); of a type with two
    (Funnel: FunnelModel, FunnelBaseModel), the first."""
    cls = _mapped(model_type)
    return cls[0] if isinstance(cls, tuple) else cls


@dataclass(frozen=True)
class HFSpec(Traceable):
    """A Hugging Face architecture with the ``GraphSpec`` interface."""

    model_id: str
    model_type: str
    kind: str = "base"
    overrides: dict[str, Any] = field(hash=False, default_factory=dict)
    seed: int = 0
    supports_bf16: bool = True
    family: str = "hf"

    @property
    def params(self) -> dict[str, Any]:
        names = self._names_or_none()
        return {"library": "hf", "arch_family": self.arch_family(), "model_type": self.model_type,
                "inputs": ",".join(names) if names else None}

    # -- config --------------------------------------------------------------------------------
    def config(self, kinds: bool = True) -> Any:
        """The tiny config: the class defaults shrunk by the rules, then the overrides. The cut
        keeps a layer of every kind (``kinds``) unless the config's own checks refuse that."""
        from transformers import CONFIG_MAPPING

        try:
            cls = CONFIG_MAPPING[self.model_type]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                defaults = cls().to_dict()
                try:
                    config = cls.from_dict(apply_overrides(shrink(defaults, kinds=kinds), self.overrides))
                except Exception as exc:  # noqa: BLE001 - its checks refuse a layer kind the cut keeps
                    try:
                        config = cls.from_dict(apply_overrides(shrink(defaults, kinds=False), self.overrides))
                    except Exception:  # noqa: BLE001
                        raise exc from None
        except Exception as exc:  # noqa: BLE001 - the library's own reason
            raise _stage("config", exc) from exc
        _no_dropout(config)
        if hasattr(config, "use_cache"):
            config.use_cache = False
        # mixture-of-experts layers: the dense batched form (grouped_mm's fake kernel wants bf16,
        # eager's loop over the routed experts is data-dependent under make_fx)
        config._experts_implementation = "batched_mm"
        return config

    def arch_family(self) -> str:
        """The modality of the model type, from its main input and config (no build)."""
        try:
            main = _main_input(_model_class(self.model_type))
            from transformers import CONFIG_MAPPING
            from transformers.models.auto.modeling_auto import (
                MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                MODEL_FOR_MASKED_LM_MAPPING_NAMES,
            )

            cfg = CONFIG_MAPPING[self.model_type]
        except Exception:  # noqa: BLE001 - no base model class: the family is unknown
            return "unknown"
        if main == "pixel_values":
            return "vision"
        if main in ("input_values", "input_features", "audio_values"):
            return "audio"
        if main in ("past_values", "inputs"):
            return "time-series"
        if main != "input_ids":
            return "other"
        fields = set(getattr(cfg, "sub_configs", {}) or {})
        if fields & {"vision_config", "audio_config", "speech_config", "vq_config", "image_config"}:
            return "multimodal"
        if getattr(cfg, "is_encoder_decoder", False) or fields & {"encoder", "decoder", "encoder_config"}:
            return "encoder-decoder"
        if self.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and self.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
            return "text-decoder"
        return "text-encoder"

    # -- inputs --------------------------------------------------------------------------------
    def _names_or_none(self) -> tuple[str, ...] | None:
        try:
            return self.names()
        except Exception:  # noqa: BLE001
            return None

    def names(self) -> tuple[str, ...]:
        """The forward arguments the spec builds: the main input, the required ones, and
        ``decoder_input_ids`` for an encoder-decoder; ZooSkip when one cannot be built."""
        try:
            cls = _model_class(self.model_type)
        except Exception as exc:  # noqa: BLE001
            raise _stage("model class", exc) from exc
        main = _main_input(cls)
        sig = inspect.signature(cls.forward).parameters
        if main not in sig:  # a main input inherited from another class (a text tower's is its tokens)
            main = next((n for n in ("input_ids", "pixel_values", "input_values", "input_features") if n in sig), main)
        names = [main] if main in sig else []
        for name, p in sig.items():
            if name == "self" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or name in names:
                continue
            if p.default is inspect.Parameter.empty:
                names.append(name)
        if "decoder_input_ids" in sig and "decoder_input_ids" not in names and self._encoder_decoder():
            names.append("decoder_input_ids")
        if main == "pixel_values" and "input_ids" in sig and "input_ids" not in names and self._has_text():
            names.append("input_ids")  # an image-to-text model: its text too
        if main == "input_ids" and "pixel_values" in sig and "pixel_values" not in names and not self._image_tokens():
            names.append("pixel_values")  # a dual encoder (no image tokens in its text): both towers
        if "pixel_values" in names and "spatial_shapes" in sig:  # NaFlex patches (SigLIP 2): their grid and mask
            names += [n for n in ("spatial_shapes", "pixel_attention_mask") if n in sig and n not in names]
        unknown = [n for n in names if inputs.builder_for(n, tuple(names)) is None]
        if unknown or not names:
            raise ZooSkip(f"inputs: forward needs {', '.join(unknown) or 'no declared input'}; "
                          f"no builder for it (main input {main!r})")
        return tuple(names)

    def _has_text(self) -> bool:
        from transformers import CONFIG_MAPPING

        return "text_config" in (getattr(CONFIG_MAPPING[self.model_type], "sub_configs", {}) or {})

    def _image_tokens(self) -> bool:
        from transformers import CONFIG_MAPPING

        cfg = CONFIG_MAPPING[self.model_type]
        return any(re.search(r"image_token|image_seq_length|mm_tokens", k) for k in (
            *getattr(cfg, "__dataclass_fields__", {}), *vars(cfg)))

    def _encoder_decoder(self) -> bool:
        from transformers import CONFIG_MAPPING

        cfg = CONFIG_MAPPING[self.model_type]
        return bool(getattr(cfg, "is_encoder_decoder", False)) or self.model_type in ("encoder-decoder",)

    def example_inputs(self, batch_shape_variant: int = 0) -> tuple:
        v = batch_shape_variant
        names = self.names()
        config = self.config()
        gen = torch.Generator().manual_seed(_seed(self.model_id, self.seed, "inputs", v))
        b = pick(v, (2, 3, 4))  # train-mode BatchNorm needs a batch > 1
        try:
            return inputs.build(names, config, b, v, gen, _model_class(self.model_type).forward.__doc__ or "")
        except ZooSkip:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _stage("inputs", exc) from exc

    def shape_variants(self) -> list[tuple]:
        return [self.example_inputs(v) for v in range(N_SHAPE_VARIANTS)]

    # -- model ---------------------------------------------------------------------------------
    def build(self) -> nn.Module:
        from transformers import AutoModel

        names = self.names()
        two = isinstance(_mapped(self.model_type), tuple)

        def maker(config: Any) -> Any:
            def make() -> nn.Module:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    # AutoModel cannot pick one of a type's two base classes (Funnel's) from a
                    # config without architectures: the first, as the mapping lists it
                    return _model_class(self.model_type)._from_config(config) if two else \
                        AutoModel.from_config(config)
            return make

        model = build_tiny(self.model_id, self.config, maker, _seed(self.model_id, self.seed, "weights"))
        return HFWrapper(model, names).float().train()

    def loss(self, output: Any) -> Tensor:
        gen = torch.Generator().manual_seed(_seed(self.model_id, self.seed, "targets"))
        return sumsq_loss(output, self.params, gen)



def build_tiny(model_id: str, config_of: Callable[..., Any], maker: Callable[[Any], Callable[[], nn.Module]],
               seed: int) -> nn.Module:
    """``maker(config_of())()`` seeded and within the budget; where the defaults cannot build a
    layer kind the cut kept (an indexed attention layer whose budget a checkpoint sets), the model
    of ``config_of(kinds=False)``: the first layers, as they are. ZooSkip with the reason."""
    config = config_of()
    try:
        return build_within_budget(model_id, maker(config), seed, "build")
    except ZooSkip as skip:
        plain = config_of(kinds=False)
        if str(skip).startswith("over budget") or plain.to_dict() == config.to_dict():
            raise
        return build_within_budget(model_id, maker(plain), seed, "build")


def enumerate_specs(limit: int | None = None) -> list[HFSpec]:
    """One spec per base model type this ``transformers`` version registers, in its order
    (builds nothing; a type that cannot be built here says why when it is built)."""
    if not available():
        raise RuntimeError(unavailable_reason())
    table = overrides()
    specs = [HFSpec(f"hf.{t}", t, "base", dict(table[t].config) if t in table else {}) for t in base_models()]
    return specs[:limit] if limit is not None else specs


def spec_by_id(model_id: str) -> HFSpec:
    if not available():
        raise KeyError(f"{model_id}: {unavailable_reason()}")
    model_type = model_id.removeprefix("hf.")
    if model_id.startswith("hf.") and model_type in base_models():
        table = overrides()
        return HFSpec(model_id, model_type, "base", dict(table[model_type].config) if model_type in table else {})
    raise KeyError(model_id)
