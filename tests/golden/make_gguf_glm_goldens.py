#!/usr/bin/env python3
"""GGUF GLM-4-MoE goldens: `glm4moe` as llama.cpp's converter writes it,
quantized by llama.cpp.

- gguf/moe-glm4moe-Q4_K_M.gguf: a tiny GLM-4.5 (half of each head
  rotated, q/k norms, q/k/v biases, a dense first layer, then
  sigmoid-scored experts with the correction bias `exp_probs_b` and a
  shared expert; the norm before the MLP is `post_attention_norm`)
  written as F32 by the gguf package's writer under llama.cpp's names,
  checked against llama.cpp itself (its logits of the F32 file equal
  mlx-lm's of the float model), then quantized by llama.cpp to Q4_K_M.
- gguf/moe-glm4moe-Q4_K_M.safetensors: the prompt and mlx-lm's logits of
  the same model with every tensor of that file dequantized by the gguf
  package.

    ~/.cache/golden-venv/bin/python tests/golden/make_gguf_glm_goldens.py
"""

import gguf
import numpy as np

from make_gguf_deepseek_goldens import LAYER as DEEPSEEK_LAYER, TOP
from make_gguf_moe_goldens import write_and_check
from make_kquant_goldens import vocabulary

D, HEADS, KV, HD, DENSE, HIDDEN, E = 256, 4, 2, 64, 512, 256, 4
CONFIG = {
    "model_type": "glm4_moe", "vocab_size": 320, "hidden_size": D,
    "num_hidden_layers": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
    "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
    "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD,
    "partial_rotary_factor": 0.5, "intermediate_size": DENSE,
    "moe_intermediate_size": HIDDEN, "n_routed_experts": E, "num_experts_per_tok": 2,
    "n_group": 1, "topk_group": 1, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "use_qk_norm": True,
    "attention_bias": True, "rope_theta": 10000.0, "rope_scaling": None,
}
LAYER = {**DEEPSEEK_LAYER, "post_attention_layernorm": "post_attention_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm"}


def gguf_name(name):
    if name in TOP:
        return TOP[name]
    _, _, i, rest = name.split(".", 3)
    if rest == "mlp.gate.e_score_correction_bias":
        return f"blk.{i}.exp_probs_b.bias"
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{i}.{LAYER[module]}.{suffix}"


def float_tensors():
    rng = np.random.default_rng(31)
    w = lambda *shape, scale=0.05: (rng.standard_normal(shape) * scale).astype(np.float32)
    v = CONFIG["vocab_size"]
    t = {"model.embed_tokens.weight": w(v, D, scale=0.5),
         "model.norm.weight": 1.0 + w(D, scale=0.1), "lm_head.weight": w(v, D)}
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        t[p + "input_layernorm.weight"] = 1.0 + w(D, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1.0 + w(D, scale=0.1)
        for n, rows in [("q", HEADS * HD), ("k", KV * HD), ("v", KV * HD)]:
            t[a + f"{n}_proj.weight"] = w(rows, D)
            t[a + f"{n}_proj.bias"] = w(rows, scale=0.1)
        t[a + "o_proj.weight"] = w(D, HEADS * HD)
        t[a + "q_norm.weight"] = 1.0 + w(HD, scale=0.1)
        t[a + "k_norm.weight"] = 1.0 + w(HD, scale=0.1)
        m = p + "mlp."
        if i == 0:
            t[m + "gate_proj.weight"] = w(DENSE, D)
            t[m + "up_proj.weight"] = w(DENSE, D)
            t[m + "down_proj.weight"] = w(D, DENSE)
            continue
        t[m + "gate.weight"] = w(E, D, scale=0.3)
        t[m + "gate.e_score_correction_bias"] = w(E, scale=0.1)
        t[m + "switch_mlp.gate_proj.weight"] = w(E, HIDDEN, D)
        t[m + "switch_mlp.up_proj.weight"] = w(E, HIDDEN, D)
        t[m + "switch_mlp.down_proj.weight"] = w(E, D, HIDDEN)
        t[m + "shared_experts.gate_proj.weight"] = w(HIDDEN, D)
        t[m + "shared_experts.up_proj.weight"] = w(HIDDEN, D)
        t[m + "shared_experts.down_proj.weight"] = w(D, HIDDEN)
    return t


def metadata(w):
    c = CONFIG
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(D)
    w.add_feed_forward_length(DENSE)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_dimension_count(int(HD * c["partial_rotary_factor"]))
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_vocab_size(c["vocab_size"])
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    vocabulary(w, c["vocab_size"])
    w.add_leading_dense_block_count(c["first_k_dense_replace"])
    w.add_expert_feed_forward_length(HIDDEN)
    w.add_expert_count(E)
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_shared_count(c["n_shared_experts"])
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    w.add_expert_weights_norm(c["norm_topk_prob"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_nextn_predict_layers(0)


def main():
    write_and_check("moe-glm4moe-Q4_K_M", "glm4moe", CONFIG, float_tensors(), gguf_name, metadata,
                    15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M


if __name__ == "__main__":
    main()
