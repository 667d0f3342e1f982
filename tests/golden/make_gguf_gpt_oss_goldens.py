#!/usr/bin/env python3
"""GGUF gpt-oss goldens: `gpt-oss` as llama.cpp's converter writes it,
its experts quantized by llama.cpp to MXFP4.

- gguf/gpt-oss-MXFP4_MOE.gguf: a tiny gpt-oss (q/k/v/o biases, a sink
  logit per head, sliding and full layers alternating, YaRN, 4 experts
  with biases, top-2 softmax over the chosen router logits, the clamped
  SwiGLU) written as F32 by the gguf package's writer under llama.cpp's
  names and metadata (the converter's `GptOssModel`: the experts
  de-interleaved into `ffn_gate_exps` / `ffn_up_exps`, biases
  `ffn_*_exps.bias`, the sinks `attn_sinks.weight`, the norm before the
  MLP `post_attention_norm`), checked against llama.cpp itself (its
  logits of the F32 file equal mlx-lm's of the float model), then
  quantized by llama.cpp with `MXFP4_MOE` (the experts in MXFP4, type 39).
- gguf/gpt-oss-MXFP4_MOE.safetensors: the prompt and mlx-lm's logits of
  the same model with every tensor of that file dequantized by the gguf
  package.

    ~/.cache/golden-venv/bin/python tests/golden/make_gguf_gpt_oss_goldens.py
"""

import gguf
import numpy as np

from make_gguf_moe_goldens import write_and_check
from make_kquant_goldens import vocabulary

D, HEADS, KV, HD, HIDDEN, E, LAYERS = 128, 4, 2, 32, 128, 4, 2
CONFIG = {
    "model_type": "gpt_oss", "vocab_size": 320, "hidden_size": D,
    "num_hidden_layers": LAYERS, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": False, "num_attention_heads": HEADS,
    "num_key_value_heads": KV, "head_dim": HD, "intermediate_size": HIDDEN,
    "num_local_experts": E, "num_experts_per_tok": 2, "sliding_window": 4,
    "layer_types": ["sliding_attention", "full_attention"],
    "attention_bias": True, "swiglu_limit": 7.0, "rope_theta": 150000.0,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                     "original_max_position_embeddings": 1024,
                     "beta_fast": 32.0, "beta_slow": 1.0},
}
TOP = {"model.embed_tokens.weight": "token_embd.weight",
       "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn": "attn_sinks", "mlp.router": "ffn_gate_inp",
         "mlp.experts.gate_proj": "ffn_gate_exps", "mlp.experts.up_proj": "ffn_up_exps",
         "mlp.experts.down_proj": "ffn_down_exps"}


def gguf_name(name):
    """llama.cpp's name of an mlx-lm tensor name (the sinks' `weight`)."""
    if name in TOP:
        return TOP[name]
    _, _, i, rest = name.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    if suffix == "sinks":
        suffix = "weight"
    return f"blk.{i}.{LAYER[module]}.{suffix}"


def float_tensors():
    """The model under mlx-lm's names (experts de-interleaved)."""
    rng = np.random.default_rng(41)
    w = lambda *shape, scale=0.05: (rng.standard_normal(shape) * scale).astype(np.float32)
    v = CONFIG["vocab_size"]
    t = {"model.embed_tokens.weight": w(v, D, scale=0.5),
         "model.norm.weight": 1.0 + w(D, scale=0.1), "lm_head.weight": w(v, D)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        t[p + "input_layernorm.weight"] = 1.0 + w(D, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1.0 + w(D, scale=0.1)
        for n, rows in [("q", HEADS * HD), ("k", KV * HD), ("v", KV * HD)]:
            t[a + f"{n}_proj.weight"] = w(rows, D)
            t[a + f"{n}_proj.bias"] = w(rows, scale=0.1)
        t[a + "o_proj.weight"] = w(D, HEADS * HD)
        t[a + "o_proj.bias"] = w(D, scale=0.1)
        t[a + "sinks"] = w(HEADS, scale=1.0)
        m = p + "mlp."
        t[m + "router.weight"] = w(E, D, scale=0.3)
        t[m + "router.bias"] = w(E, scale=0.1)
        for n, shape in [("gate_proj", (E, HIDDEN, D)), ("up_proj", (E, HIDDEN, D)),
                         ("down_proj", (E, D, HIDDEN))]:
            t[m + f"experts.{n}.weight"] = w(*shape, scale=0.2)
            t[m + f"experts.{n}.bias"] = w(*shape[:2], scale=0.1)
    return t


def metadata(w):
    c = CONFIG
    w.add_block_count(LAYERS)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(D)
    w.add_feed_forward_length(HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_vocab_size(c["vocab_size"])
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    vocabulary(w, c["vocab_size"])
    w.add_expert_count(E)
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_sliding_window(c["sliding_window"])
    w.add_expert_feed_forward_length(HIDDEN)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(c["rope_scaling"]["factor"])
    w.add_rope_scaling_orig_ctx_len(c["rope_scaling"]["original_max_position_embeddings"])


def main():
    write_and_check("gpt-oss-MXFP4_MOE", "gpt-oss", CONFIG, float_tensors(), gguf_name, metadata,
                    38)  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE


if __name__ == "__main__":
    main()
