#!/usr/bin/env python3
"""Tiny random Phi-3s (fused qkv_proj and gate_up_proj) and their logits
from mlx-lm, as `make_llama_goldens.py` does for the Llama family.

Writes tests/golden/llama/CASE/ (config.json, model.safetensors) and
golden.safetensors ("tokens" I32, mlx-lm's "logits" F32 [T, V]). The Rust
tests load them with safemlx-dist at 1-4 ranks and compare.

- phi3-fused: 6 query heads over 3 KV heads (uneven at 2 ranks, a KV head
  shared at 4); the MLP's 80 hidden columns are uneven at 3.
- phi4-mini-longrope: Phi-4-mini's form, 3/4 of each head rotated
  (`partial_rotary_factor` 0.75) with LongRoPE (`rope_scaling` type
  `longrope`, 128k over an original 4k: mlx-lm's `SuScaledRoPE`), tied
  embeddings.

Run once, commit the output; CI needs no Python:

    python3 -m venv /tmp/golden && /tmp/golden/bin/pip install \
        "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" numpy safetensors
    /tmp/golden/bin/python tests/golden/make_phi3_goldens.py
"""

import mlx.core as mx
import numpy as np
from mlx_lm.utils import load_model
from safetensors.numpy import save_file

from make_llama_goldens import BASE, PROMPT, write

PHI3 = {**BASE, "model_type": "phi3", "num_attention_heads": 6,
        "num_key_value_heads": 3, "tie_word_embeddings": False,
        "original_max_position_embeddings": 4096}
# head_dim 16, 12 rotated dimensions: 6 pairs, each with its factor.
PHI4 = {**BASE, "model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "tie_word_embeddings": True,
        "partial_rotary_factor": 0.75, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_scaling": {"type": "longrope",
                         "long_factor": [1.0, 1.2, 2.5, 4.0, 9.0, 16.0],
                         "short_factor": [1.0, 1.0, 1.1, 1.2, 1.5, 2.0]}}
CASES = {"phi3-fused": (PHI3, 100), "phi4-mini-longrope": (PHI4, 101)}


def weights(config, rng):
    d, h, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = d // heads

    def w(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t = {"model.embed_tokens.weight": w(v, d, scale=0.15),
         "model.norm.weight": 1.0 + w(d, scale=0.1)}
    if not config["tie_word_embeddings"]:
        t["lm_head.weight"] = w(v, d)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1.0 + w(d, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1.0 + w(d, scale=0.1)
        # q rows, then k, then v, in one tensor.
        t[p + "self_attn.qkv_proj.weight"] = w((heads + 2 * kv) * hd, d)
        t[p + "self_attn.o_proj.weight"] = w(d, heads * hd)
        # gate rows, then up.
        t[p + "mlp.gate_up_proj.weight"] = w(2 * h, d)
        t[p + "mlp.down_proj.weight"] = w(d, h)
    return t


def main():
    for case, (config, seed) in CASES.items():
        path = write(case, config, weights(config, np.random.default_rng(seed)))
        model, _ = load_model(path)
        logits = model(mx.array([PROMPT]))[0].astype(mx.float32)
        golden = {"tokens": np.array(PROMPT, dtype=np.int32), "logits": np.array(logits)}
        save_file(golden, path / "golden.safetensors")
        print(f"{case}: logits {golden['logits'].shape}, "
              f"argmax {golden['logits'].argmax(-1).tolist()}")


if __name__ == "__main__":
    main()
