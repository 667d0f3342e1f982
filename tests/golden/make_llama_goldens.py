#!/usr/bin/env python3
"""Tiny random Llama-family models and their logits from mlx-lm.

Writes, for each case below, a Hugging Face model directory under
tests/golden/llama/CASE/ (config.json and safetensors written by the
`safetensors` package, one case split in two shards with an index) and
golden.safetensors holding the prompt ("tokens", I32) and mlx-lm's logits
for it ("logits", F32 [T, V]). The Rust tests load the same directories
with safemlx-dist at 1-4 ranks and compare.

Run once, commit the output; CI needs no Python:

    python3 -m venv /tmp/golden && /tmp/golden/bin/pip install \
        "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" numpy safetensors
    /tmp/golden/bin/python tests/golden/make_llama_goldens.py
"""

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.utils import load_model
from safetensors.numpy import save_file

OUT = Path(__file__).parent / "llama"
PROMPT = [1, 5, 17, 33, 2, 60, 66, 12, 40]

BASE = {
    "vocab_size": 67,
    "hidden_size": 48,
    "intermediate_size": 80,
    "num_hidden_layers": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}

CASES = {
    # SmolLM2's shape in small: tied embeddings, 3 KV heads (uneven over 2).
    "llama-tied-kv3": dict(model_type="llama", num_attention_heads=6,
                           num_key_value_heads=3, tie_word_embeddings=True),
    # One KV head (fewer than ranks), Llama 3.1 RoPE scaling, two shards.
    "llama3-kv1-sharded": dict(model_type="llama", num_attention_heads=4,
                               num_key_value_heads=1, tie_word_embeddings=False,
                               rope_theta=500000.0,
                               rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                             "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 64}),
    "mistral-kv2": dict(model_type="mistral", num_attention_heads=4,
                        num_key_value_heads=2, tie_word_embeddings=False,
                        sliding_window=4096),
    # q/k/v biases.
    "qwen2-bias": dict(model_type="qwen2", num_attention_heads=4,
                       num_key_value_heads=2, tie_word_embeddings=True,
                       rope_theta=1000000.0),
    # q/k norms and a head_dim that is not hidden_size / heads.
    "qwen3-qknorm": dict(model_type="qwen3", num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16,
                         tie_word_embeddings=False, rope_theta=1000000.0),
    # Qwen3's long-context form: YaRN RoPE (frequencies blended between
    # interpolation and extrapolation, q and k scaled by its mscale).
    "qwen3-yarn": dict(model_type="qwen3", num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16,
                       tie_word_embeddings=False, rope_theta=10000.0,
                       rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                     "original_max_position_embeddings": 64,
                                     "beta_fast": 32.0, "beta_slow": 1.0}),
    # Sliding-window layers (window 3, shorter than the prompt) around a
    # full-attention one, as gpt-oss and Gemma alternate them.
    "llama-window": dict(model_type="llama", num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=False,
                         num_hidden_layers=3, sliding_window=3,
                         layer_types=["sliding_attention", "full_attention",
                                      "sliding_attention"]),
    # Llama's attention_bias: biases on q, k, v and o.
    "llama-bias": dict(model_type="llama", num_attention_heads=4,
                       num_key_value_heads=2, tie_word_embeddings=False,
                       attention_bias=True),
    # SmolLM2's head layout (9 query heads over 3 KV heads, tied
    # embeddings) with 5 layers, for pipeline stages of uneven layer counts.
    "smollm2-5layers": dict(model_type="llama", hidden_size=72,
                            num_attention_heads=9, num_key_value_heads=3,
                            num_hidden_layers=5, tie_word_embeddings=True),
}

# Each case's weights seed (fixed, so adding a case leaves the others'
# weights as they were).
SEEDS = {"llama-tied-kv3": 0, "llama3-kv1-sharded": 1, "mistral-kv2": 2,
         "qwen2-bias": 3, "qwen3-qknorm": 4, "qwen3-yarn": 5, "llama-window": 6,
         "llama-bias": 7, "smollm2-5layers": 8}


def weights(config, rng):
    d, h, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim", d // heads)

    def w(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t = {"model.embed_tokens.weight": w(v, d, scale=0.15),
         "model.norm.weight": (1.0 + w(d, scale=0.1))}
    if not config["tie_word_embeddings"]:
        t["lm_head.weight"] = w(v, d, scale=0.2)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1.0 + w(d, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1.0 + w(d, scale=0.1)
        t[p + "self_attn.q_proj.weight"] = w(heads * hd, d)
        t[p + "self_attn.k_proj.weight"] = w(kv * hd, d)
        t[p + "self_attn.v_proj.weight"] = w(kv * hd, d)
        t[p + "self_attn.o_proj.weight"] = w(d, heads * hd)
        if config["model_type"] == "qwen2" or config.get("attention_bias"):
            t[p + "self_attn.q_proj.bias"] = w(heads * hd, scale=0.1)
            t[p + "self_attn.k_proj.bias"] = w(kv * hd, scale=0.1)
            t[p + "self_attn.v_proj.bias"] = w(kv * hd, scale=0.1)
        if config.get("attention_bias"):
            t[p + "self_attn.o_proj.bias"] = w(d, scale=0.1)
        if config["model_type"] == "qwen3":
            t[p + "self_attn.q_norm.weight"] = 1.0 + w(hd, scale=0.1)
            t[p + "self_attn.k_norm.weight"] = 1.0 + w(hd, scale=0.1)
        t[p + "mlp.gate_proj.weight"] = w(h, d)
        t[p + "mlp.up_proj.weight"] = w(h, d)
        t[p + "mlp.down_proj.weight"] = w(d, h)
    return t


def write(case, config, tensors):
    path = OUT / case
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.safetensors*"):
        old.unlink()
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if case.endswith("sharded"):
        names = sorted(tensors)
        halves = [names[: len(names) // 2], names[len(names) // 2:]]
        weight_map = {}
        for k, part in enumerate(halves):
            file = f"model-{k + 1:05d}-of-00002.safetensors"
            save_file({n: tensors[n] for n in part}, path / file, metadata={"format": "pt"})
            weight_map.update({n: file for n in part})
        index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
                 "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    else:
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def main():
    for case, extra in sorted(CASES.items()):
        config = {**BASE, **extra}
        path = write(case, config, weights(config, np.random.default_rng(SEEDS[case])))
        model, _ = load_model(path)
        logits = model(mx.array([PROMPT]))[0].astype(mx.float32)
        golden = {"tokens": np.array(PROMPT, dtype=np.int32),
                  "logits": np.array(logits)}
        save_file(golden, path / "golden.safetensors")
        print(f"{case}: logits {golden['logits'].shape}, argmax {golden['logits'].argmax(-1).tolist()}")


if __name__ == "__main__":
    main()
