#!/usr/bin/env python3
"""GGUF Phi-3 goldens: `phi3` as llama.cpp's converter writes it,
quantized by llama.cpp.

- gguf/phi4-mini-Q4_K_M.gguf: a tiny Phi-4-mini (q, k and v fused in
  `attn_qkv`, gate and up fused in `ffn_up`, 3/4 of each head rotated with
  LongRoPE: `rope_factors_long` / `rope_factors_short` and
  `rope.scaling.attn_factor`, tied embeddings) written as F32 by the gguf
  package's writer under llama.cpp's names, checked against llama.cpp
  itself (its logits of the F32 file equal mlx-lm's of the float model;
  the short and long factors are equal, as llama.cpp takes the short ones
  for a short context and mlx-lm always the long), then quantized by
  llama.cpp to Q4_K_M.
- gguf/phi4-mini-Q4_K_M.safetensors: the prompt and mlx-lm's logits of
  the same model with every tensor of that file dequantized by the gguf
  package.

    ~/.cache/golden-venv/bin/python tests/golden/make_gguf_phi3_goldens.py
"""

import math

import gguf
import numpy as np

from make_gguf_moe_goldens import write_and_check
from make_kquant_goldens import vocabulary

D, HEADS, KV, FF, LAYERS = 256, 4, 2, 256, 2
HD = D // HEADS
ROTATED = 48  # 3/4 of 64
FACTORS = [1.0, 1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0,
           9.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0]
CONFIG = {
    "model_type": "phi3", "vocab_size": 320, "hidden_size": D,
    "intermediate_size": FF, "num_hidden_layers": LAYERS, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2,
    "num_attention_heads": HEADS, "num_key_value_heads": KV,
    "tie_word_embeddings": True, "partial_rotary_factor": ROTATED / HD,
    "rope_scaling": {"type": "longrope", "long_factor": FACTORS, "short_factor": FACTORS},
}
TOP = {"model.embed_tokens.weight": "token_embd.weight",
       "model.norm.weight": "output_norm.weight"}
LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
         "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(name):
    if name in TOP:
        return TOP[name]
    _, _, i, rest = name.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{i}.{LAYER[module]}.{suffix}"


def float_tensors():
    rng = np.random.default_rng(41)
    w = lambda *shape, scale=0.05: (rng.standard_normal(shape) * scale).astype(np.float32)
    t = {"model.embed_tokens.weight": w(CONFIG["vocab_size"], D, scale=0.5),
         "model.norm.weight": 1.0 + w(D, scale=0.1)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1.0 + w(D, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1.0 + w(D, scale=0.1)
        t[p + "self_attn.qkv_proj.weight"] = w((HEADS + 2 * KV) * HD, D)
        t[p + "self_attn.o_proj.weight"] = w(D, HEADS * HD)
        t[p + "mlp.gate_up_proj.weight"] = w(2 * FF, D)
        t[p + "mlp.down_proj.weight"] = w(D, FF)
    return t


def metadata(w):
    c = CONFIG
    w.add_context_length(c["max_position_embeddings"])
    w.add_rope_scaling_orig_ctx_len(c["original_max_position_embeddings"])
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_dimension_count(ROTATED)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_vocab_size(c["vocab_size"])
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    vocabulary(w, c["vocab_size"])
    # convert_hf_to_gguf.py's Phi3MiniModel: the factors as tensors, the
    # factor on q and k from the context lengths.
    scale = c["max_position_embeddings"] / c["original_max_position_embeddings"]
    orig = c["original_max_position_embeddings"]
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)))
    w.add_tensor("rope_factors_long.weight", np.array(FACTORS, dtype=np.float32))
    w.add_tensor("rope_factors_short.weight", np.array(FACTORS, dtype=np.float32))


def main():
    write_and_check("phi4-mini-Q4_K_M", "phi3", CONFIG, float_tensors(), gguf_name, metadata,
                    15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M


if __name__ == "__main__":
    main()
