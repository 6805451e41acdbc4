#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Builds a tiny Llama model directory that vLLM loads without a model hub:
config.json, random weights from a fixed seed (model.safetensors) and a
byte-level BPE tokenizer trained on a small built-in text (tokenizer.json).
Same arguments, same bytes. --intermediate and --dtype make "another model"
with the same parameter names (a different layout in the GMS).

Needs numpy, safetensors and tokenizers (tests/setup-vllm-cpu.sh installs them).
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TEXT = """The quick brown fox jumps over the lazy dog. A standby engine keeps its weights
in shared memory and sleeps until the lock is granted. When the active engine dies,
the standby wakes, maps the same weights and answers the same prompts with the same
tokens. Failover should take a fraction of a second, while a cold start loads every
weight again from disk. One, two, three, four, five, six, seven, eight, nine, ten.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Red, green, blue.
"""

SPECIAL = ["<s>", "</s>", "<unk>"]


def build_tokenizer(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT] * 4, trainer=trainer)
    return tok


def main(argv: "list[str] | None" = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="directory to write (created)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--vocab", type=int, default=384)
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--tie", action="store_true",
                   help="tied word embeddings: lm_head shares embed_tokens' weight (one storage, two names)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)

    tok = build_tokenizer(a.vocab)
    tok.save(str(a.out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    (a.out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 512, "add_bos_token": False}, indent=1))
    head_dim = a.hidden // a.heads
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": a.hidden,
        "intermediate_size": a.intermediate, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads, "head_dim": head_dim, "vocab_size": vocab,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "tie_word_embeddings": a.tie, "bos_token_id": tok.token_to_id("<s>"),
        "eos_token_id": tok.token_to_id("</s>"), "torch_dtype": a.dtype, "dtype": a.dtype,
    }
    (a.out / "config.json").write_text(json.dumps(config, indent=1))
    (a.out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}))

    rng = np.random.default_rng(a.seed)
    dt = np.dtype(a.dtype)

    def rand(*shape: int) -> "np.ndarray":
        return (rng.standard_normal(shape, dtype=np.float32) * (1.0 / np.sqrt(shape[-1]))).astype(dt)

    w = {"model.embed_tokens.weight": rand(vocab, a.hidden), "model.norm.weight": np.ones(a.hidden, dt)}
    if not a.tie:
        w["lm_head.weight"] = rand(vocab, a.hidden)
    for i in range(a.layers):
        pre = f"model.layers.{i}."
        w[pre + "input_layernorm.weight"] = np.ones(a.hidden, dt)
        w[pre + "post_attention_layernorm.weight"] = np.ones(a.hidden, dt)
        w[pre + "self_attn.q_proj.weight"] = rand(a.heads * head_dim, a.hidden)
        w[pre + "self_attn.k_proj.weight"] = rand(a.kv_heads * head_dim, a.hidden)
        w[pre + "self_attn.v_proj.weight"] = rand(a.kv_heads * head_dim, a.hidden)
        w[pre + "self_attn.o_proj.weight"] = rand(a.hidden, a.heads * head_dim)
        w[pre + "mlp.gate_proj.weight"] = rand(a.intermediate, a.hidden)
        w[pre + "mlp.up_proj.weight"] = rand(a.intermediate, a.hidden)
        w[pre + "mlp.down_proj.weight"] = rand(a.hidden, a.intermediate)
    save_file(w, str(a.out / "model.safetensors"), metadata={"format": "pt"})
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
