"""Tiny Hugging Face models for tests/test_audit_hf.py: random weights from configs, nothing downloaded."""

from __future__ import annotations

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

VOCAB = 128


def _tokens(*shape: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(0))


def gpt2():  # noqa: ANN201 - its output holds a KV cache (DynamicCache)
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=2)
    return GPT2LMHeadModel(cfg).eval(), (_tokens(2, 16),)


def bert():  # noqa: ANN201
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    return BertForMaskedLM(cfg).eval(), (_tokens(2, 16),)


def t5():  # noqa: ANN201 - encoder-decoder: its output holds an EncoderDecoderCache
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    cfg = T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
                   decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(cfg).eval()
    return model, (_tokens(2, 16), None, _tokens(2, 8))  # input_ids, attention_mask, decoder_input_ids
