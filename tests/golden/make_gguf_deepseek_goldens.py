#!/usr/bin/env python3
"""GGUF DeepSeek-V3 goldens: `deepseek2` as llama.cpp's converter writes
it, quantized by llama.cpp.

- gguf/moe-deepseek2-Q8_0.gguf: a tiny DeepSeek-V3 (latent attention with
  a query latent, YaRN, a dense first layer, then sigmoid-scored experts
  with the correction bias `exp_probs_b` and a shared expert; one expert
  group, as llama.cpp 0.3.16 does not limit the choice to groups: with
  two groups its logits part from mlx-lm's by 0.6)
  written as F32 by the gguf package's writer with the metadata and
  tensors of llama.cpp's converter (`kv_b_proj` split per head into
  `attn_k_b` [H, r, nope] and `attn_v_b` [H, v, r], `head_count_kv` 1,
  `key_length_mla`), checked against llama.cpp itself (its logits of the
  F32 file equal mlx-lm's of the float model), then quantized by
  llama.cpp to Q8_0 (every row of a K-quant must be 256 wide; the
  heads' rows here are 32).
- gguf/moe-deepseek2-Q8_0.safetensors: the prompt and mlx-lm's logits of
  the same model with every tensor of that file dequantized by the gguf
  package (`kv_b_proj` put back together).

    ~/.cache/golden-venv/bin/python tests/golden/make_gguf_deepseek_goldens.py
"""

import gguf
import numpy as np

from make_gguf_moe_goldens import check_and_quantize
from make_kquant_goldens import vocabulary

D, HEADS, QL, R, NOPE, ROPE, V, DENSE, HIDDEN, E = 256, 4, 64, 64, 32, 32, 32, 512, 256, 4
MSCALE = 0.8
CONFIG = {
    "model_type": "deepseek_v3", "vocab_size": 320, "hidden_size": D,
    "num_hidden_layers": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
    "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
    "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "q_lora_rank": QL,
    "kv_lora_rank": R, "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE,
    "v_head_dim": V, "intermediate_size": DENSE, "moe_intermediate_size": HIDDEN,
    "n_routed_experts": E, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
    "n_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc", "attention_bias": False, "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1, "mscale": MSCALE,
                     "mscale_all_dim": MSCALE},
}
TOP = {"model.embed_tokens.weight": "token_embd.weight",
       "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_a_proj": "attn_q_a", "self_attn.q_a_layernorm": "attn_q_a_norm",
         "self_attn.q_b_proj": "attn_q_b", "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
         "self_attn.kv_a_layernorm": "attn_kv_a_norm", "self_attn.o_proj": "attn_output",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
         "mlp.gate": "ffn_gate_inp", "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
         "mlp.switch_mlp.up_proj": "ffn_up_exps", "mlp.switch_mlp.down_proj": "ffn_down_exps",
         "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
         "mlp.shared_experts.up_proj": "ffn_up_shexp",
         "mlp.shared_experts.down_proj": "ffn_down_shexp"}


def float_tensors():
    """The model under mlx-lm's names (the experts stacked as
    `switch_mlp`, `kv_b_proj` whole)."""
    rng = np.random.default_rng(21)
    w = lambda *shape, scale=0.05: (rng.standard_normal(shape) * scale).astype(np.float32)
    v = CONFIG["vocab_size"]
    t = {"model.embed_tokens.weight": w(v, D, scale=0.5),
         "model.norm.weight": 1.0 + w(D, scale=0.1), "lm_head.weight": w(v, D)}
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        t[p + "input_layernorm.weight"] = 1.0 + w(D, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1.0 + w(D, scale=0.1)
        t[a + "q_a_proj.weight"] = w(QL, D)
        t[a + "q_a_layernorm.weight"] = 1.0 + w(QL, scale=0.1)
        t[a + "q_b_proj.weight"] = w(HEADS * (NOPE + ROPE), QL, scale=0.1)
        t[a + "kv_a_proj_with_mqa.weight"] = w(R + ROPE, D)
        t[a + "kv_a_layernorm.weight"] = 1.0 + w(R, scale=0.1)
        t[a + "kv_b_proj.weight"] = w(HEADS * (NOPE + V), R, scale=0.1)
        t[a + "o_proj.weight"] = w(D, HEADS * V)
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


def gguf_tensors(t):
    """`t` under llama.cpp's names, `kv_b_proj` split as its converter
    splits it."""
    out = {}
    for name, value in t.items():
        if name in TOP:
            out[TOP[name]] = value
            continue
        _, _, i, rest = name.split(".", 3)
        if rest == "mlp.gate.e_score_correction_bias":
            out[f"blk.{i}.exp_probs_b.bias"] = value
        elif rest == "self_attn.kv_b_proj.weight":
            kv_b = value.reshape(HEADS, NOPE + V, R)
            out[f"blk.{i}.attn_k_b.weight"] = np.ascontiguousarray(
                kv_b[:, :NOPE].transpose(0, 2, 1))
            out[f"blk.{i}.attn_v_b.weight"] = np.ascontiguousarray(kv_b[:, NOPE:])
        else:
            module, suffix = rest.rsplit(".", 1)
            out[f"blk.{i}.{LAYER[module]}.{suffix}"] = value
    return out


def from_gguf(values):
    """llama.cpp's tensors (dequantized) under mlx-lm's names."""
    back = {}
    for name in float_tensors():
        if name in TOP:
            back[TOP[name]] = name
            continue
        _, _, i, rest = name.split(".", 3)
        if rest == "mlp.gate.e_score_correction_bias":
            back[f"blk.{i}.exp_probs_b.bias"] = name
        elif rest != "self_attn.kv_b_proj.weight":
            module, suffix = rest.rsplit(".", 1)
            back[f"blk.{i}.{LAYER[module]}.{suffix}"] = name
    out = {back[n]: v for n, v in values.items() if n in back}
    for i in range(CONFIG["num_hidden_layers"]):
        k_b = values[f"blk.{i}.attn_k_b.weight"].transpose(0, 2, 1)
        v_b = values[f"blk.{i}.attn_v_b.weight"]
        kv_b = np.concatenate([k_b, v_b], axis=1).reshape(HEADS * (NOPE + V), R)
        out[f"model.layers.{i}.self_attn.kv_b_proj.weight"] = kv_b
    return out


def write(path, tensors):
    c = CONFIG
    w = gguf.GGUFWriter(path, "deepseek2")
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(D)
    w.add_feed_forward_length(DENSE)
    w.add_head_count(HEADS)
    w.add_head_count_kv(1)  # the latent is one MQA head in llama.cpp
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_vocab_size(c["vocab_size"])
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    vocabulary(w, c["vocab_size"])
    w.add_q_lora_rank(QL)
    w.add_kv_lora_rank(R)
    w.add_key_length(R + ROPE)
    w.add_value_length(R)
    w.add_key_length_mla(NOPE + ROPE)
    w.add_value_length_mla(V)
    w.add_rope_dimension_count(ROPE)
    w.add_leading_dense_block_count(c["first_k_dense_replace"])
    w.add_expert_feed_forward_length(HIDDEN)
    w.add_expert_count(E)
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_shared_count(c["n_shared_experts"])
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    w.add_expert_weights_norm(c["norm_topk_prob"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_group_count(c["n_group"])
    w.add_expert_group_used_count(c["topk_group"])
    r = c["rope_scaling"]
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(r["factor"])
    w.add_rope_scaling_orig_ctx_len(r["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_log_mul(0.1 * r["mscale_all_dim"])
    for name, t in sorted(tensors.items()):
        w.add_tensor(name, np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    check_and_quantize("moe-deepseek2-Q8_0", CONFIG,
                       lambda path: write(path, gguf_tensors(float_tensors())),
                       float_tensors(), 7, from_gguf)  # LLAMA_FTYPE_MOSTLY_Q8_0


if __name__ == "__main__":
    main()
