"""The causal language models the generation lane decodes with, and their prompts.

The models are transformers' own: every model type of its causal-LM auto mapping
(``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, 200 in transformers 5.25), built as the model zoo builds
its architectures (:class:`conformance.models.hf.HFSpec`: the config class's defaults shrunk by
rules, the validated overrides, random seeded weights, nothing downloaded), with what decoding
needs on top: the cache on, positions for the longest prompt plus the new tokens, and the weights'
spread of ``generation.toml``'s ``initializer_range`` (near-uniform logits make every flip a near
tie). Model ids are the zoo's (``hf.llama``); a type that cannot be built says why
(:class:`~conformance.models.zoo.ZooSkip`).

Selection (``--generate``): ``hf`` (every causal LM), ``hf@K/N`` (those whose id hashes to K
modulo N, as the zoo slices), model ids, or a comma list of those.

Prompts are seeded token ids drawn below the vocabulary's special tokens, ``prompts`` per bucket,
each exactly the bucket's length (what a server that pads to buckets hands the model); the
continuation whose log-likelihood is scored is drawn the same way.

Example::

    >>> from conformance.generate.lms import prompts
    >>> [tuple(p.shape) for p in prompts("hf.llama", 8, vocab=128, n=2)]
    [(1, 8), (1, 8)]
"""

from __future__ import annotations

import warnings
import zlib
from typing import Any

import torch
from torch import nn

from conformance.select import SelectionError, parse_k_of_n

LIBRARY = "hf"
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_sequence_length",
                 "seq_length", "block_size", "max_length")


def _seed(*parts: Any) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


def available() -> bool:
    from conformance.models import hf

    return hf.available()


def causal_types(option: str = "--generate") -> list[str]:
    """Every model type of transformers' causal-LM mapping, in the library's order."""
    from conformance.models import hf

    if not hf.available():
        raise SelectionError(f"{option}: {hf.unavailable_reason()}")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def select(names: tuple[str, ...] | list[str], *, option: str = "--generate") -> list[str]:
    """The model ids ``names`` select (see the module doc), in the library's order, no repeats;
    errors name ``option`` (the perf lane's ``--decode`` selects the same way)."""
    from conformance.models.selection import in_zoo_slice

    words = [w.strip() for n in names for w in str(n).split(",") if w.strip()]
    if not words:
        return []
    ids = [f"{LIBRARY}.{t}" for t in causal_types(option)]
    out: list[str] = []
    for w in words:
        lib, at, part = w.partition("@")
        if lib == LIBRARY:
            part = parse_k_of_n(part, f"{option} {w!r}", "hf@", "hf@3/20") if at else "all"
            out += [i for i in ids if in_zoo_slice(i, part)]
        elif w in ids:
            out.append(w)
        else:
            import difflib

            near = difflib.get_close_matches(w, ids, n=3)
            raise SelectionError(f"{option} {w!r}: not a causal LM of this transformers "
                                 f"(hf, hf@K/N or an id such as hf.llama)"
                                 + (f"; did you mean {', '.join(near)}?" if near else ""))
    return list(dict.fromkeys(out))


def config(model_id: str, positions: int, initializer_range: float, kinds: bool = True) -> Any:
    """The tiny config of ``model_id`` with the cache on and room for ``positions`` tokens (``kinds``:
    as :meth:`HFSpec.config <conformance.models.hf.HFSpec.config>` keeps a layer of every kind)."""
    from conformance.models import hf

    spec = hf.spec_by_id(model_id)
    cfg = spec.config(kinds=kinds)
    cfg.use_cache = True
    for c in (cfg, getattr(cfg, "text_config", None)):
        if c is None:
            continue
        for key in POSITION_KEYS:
            value = getattr(c, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and 0 < value < positions:
                setattr(c, key, positions)
        if hasattr(c, "initializer_range"):
            c.initializer_range = initializer_range
    return cfg


def build(model_id: str, positions: int, initializer_range: float) -> nn.Module:
    """The causal LM of ``model_id`` (eval mode, float32, seeded random weights, within the zoo's
    parameter budget); :class:`~conformance.models.zoo.ZooSkip` with the library's reason."""
    from transformers import AutoModelForCausalLM

    from conformance.models import hf
    from conformance.models.zoo import ZooSkip

    def cfg_of(kinds: bool = True) -> Any:
        try:
            return config(model_id, positions, initializer_range, kinds)
        except ZooSkip:
            raise
        except Exception as exc:  # noqa: BLE001 - the library's own reason
            raise ZooSkip(f"config: {type(exc).__name__}: {exc}"[:2000]) from exc

    def maker(cfg: Any) -> Any:
        def make() -> nn.Module:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return AutoModelForCausalLM.from_config(cfg)
        return make

    model = hf.build_tiny(model_id, cfg_of, maker, _seed(model_id, "generate", "weights"))
    return model.float().eval()


def vocab(model: nn.Module) -> int:
    emb = model.get_output_embeddings()
    n = getattr(emb, "out_features", None) or getattr(model.config, "vocab_size", None)
    return int(n)


def _draw(n_tokens: int, vocab_size: int, gen: torch.Generator) -> torch.Tensor:
    from conformance.models.hf.rules import SPECIAL

    high = vocab_size - SPECIAL if vocab_size > 2 * SPECIAL else vocab_size
    return torch.randint(3 if high > 3 else 0, high, (1, n_tokens), generator=gen)


def prompts(model_id: str, bucket: int, *, vocab: int, n: int) -> list[torch.Tensor]:
    """``n`` seeded prompts of ``bucket`` tokens (batch 1 each)."""
    gen = torch.Generator().manual_seed(_seed(model_id, "prompts", bucket))
    return [_draw(bucket, vocab, gen) for _ in range(n)]


def continuation(model_id: str, bucket: int, *, vocab: int, n: int) -> torch.Tensor:
    """The fixed continuation (``n`` tokens) whose log-likelihood after the bucket's first prompt is scored."""
    gen = torch.Generator().manual_seed(_seed(model_id, "continuation", bucket))
    return _draw(n, vocab, gen)
