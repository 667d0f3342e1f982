"""The random models `cargo xtask bench moe` and `bench layouts` run (on
our side and mlx-lm's), written as Hugging Face directories with a real
tokenizer: a small Mixtral-layout model and DeepSeek-V3-, GLM-4-MoE- and
gpt-oss-shaped ones. `peers.py make-*` calls these; see its usage.
"""

import json
from pathlib import Path

import numpy as np

def make_moe(out, tokenizer_dir):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "mixtral", "vocab_size": 320, "hidden_size": 512,
              "intermediate_size": 1024, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 4,
              "num_local_experts": 8, "num_experts_per_tok": 2,
              "rms_norm_eps": 1e-5, "rope_theta": 1e6, "max_position_embeddings": 4096,
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
              "torch_dtype": "float32"}
    rng = np.random.default_rng(0)
    d, h, v, e = 512, 1024, 320, 8
    hd = d // 8

    def w(*shape, scale=0.05):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": 1.0 + w(d),
         "lm_head.weight": w(v, d)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1.0 + w(d)
        t[p + "post_attention_layernorm.weight"] = 1.0 + w(d)
        t[p + "self_attn.q_proj.weight"] = w(8 * hd, d)
        t[p + "self_attn.k_proj.weight"] = w(4 * hd, d)
        t[p + "self_attn.v_proj.weight"] = w(4 * hd, d)
        t[p + "self_attn.o_proj.weight"] = w(d, 8 * hd)
        t[p + "block_sparse_moe.gate.weight"] = w(e, d, scale=0.5)
        for x in range(e):
            for name, shape in [("w1", (h, d)), ("w3", (h, d)), ("w2", (d, h))]:
                t[p + f"block_sparse_moe.experts.{x}.{name}.weight"] = w(*shape)
    write_model(out, t, config, tokenizer_dir)


def write_model(out, tensors, config, tokenizer_dir):
    """A Hugging Face directory at `out`: the tensors, config.json and the
    tokenizer files of `tokenizer_dir`."""
    from safetensors.numpy import save_file
    import shutil
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(Path(tokenizer_dir) / name, out / name)


def biased_attention(t, p, w, dims):
    """A layer's two norms and its attention's q/k/v weights and biases and
    o weight under `p` (gpt-oss, GLM-4-MoE)."""
    d, heads, kv, hd = dims
    a = p + "self_attn."
    t[p + "input_layernorm.weight"] = 1.0 + w(d)
    t[p + "post_attention_layernorm.weight"] = 1.0 + w(d)
    for name, rows in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
        t[a + name + ".weight"] = w(rows, d)
        t[a + name + ".bias"] = w(rows)
    t[a + "o_proj.weight"] = w(d, heads * hd)


def grouped_moe(t, m, dense_layer, w, dims):
    """DeepSeek-V3's and GLM-4-MoE's feed-forward tensors under `m`: a
    dense MLP (the first layers), or a router with its correction bias,
    one shared expert and the routed experts."""
    d, dense, e, h = dims
    if dense_layer:
        for name, shape in [("gate_proj", (dense, d)), ("up_proj", (dense, d)),
                            ("down_proj", (d, dense))]:
            t[m + name + ".weight"] = w(*shape)
        return
    t[m + "gate.weight"] = w(e, d, scale=0.5)
    t[m + "gate.e_score_correction_bias"] = w(e, scale=0.3)
    for name, shape in [("gate_proj", (h, d)), ("up_proj", (h, d)), ("down_proj", (d, h))]:
        t[m + "shared_experts." + name + ".weight"] = w(*shape)
        for x in range(e):
            t[m + f"experts.{x}.{name}.weight"] = w(*shape)


def make_deepseek(out, tokenizer_dir):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    d, heads, ql, r, nope, rope, vd = 1024, 16, 384, 256, 64, 32, 64
    e, h, dense, v = 32, 512, 2048, 320
    config = {"model_type": "deepseek_v3", "vocab_size": v, "hidden_size": d,
              "intermediate_size": dense, "moe_intermediate_size": h,
              "num_hidden_layers": 8, "num_attention_heads": heads,
              "num_key_value_heads": heads, "q_lora_rank": ql, "kv_lora_rank": r,
              "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": vd,
              "n_routed_experts": e, "num_experts_per_tok": 4, "n_group": 4,
              "topk_group": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
              "moe_layer_freq": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
              "scoring_func": "sigmoid", "topk_method": "noaux_tc",
              "attention_bias": False, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "rope_scaling": None, "max_position_embeddings": 4096,
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
              "torch_dtype": "float32"}
    rng = np.random.default_rng(1)

    def w(*shape, scale=0.03):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    t = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": 1.0 + w(d),
         "lm_head.weight": w(v, d)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        t[p + "input_layernorm.weight"] = 1.0 + w(d)
        t[p + "post_attention_layernorm.weight"] = 1.0 + w(d)
        t[a + "q_a_proj.weight"] = w(ql, d)
        t[a + "q_a_layernorm.weight"] = 1.0 + w(ql)
        t[a + "q_b_proj.weight"] = w(heads * (nope + rope), ql)
        t[a + "kv_a_proj_with_mqa.weight"] = w(r + rope, d)
        t[a + "kv_a_layernorm.weight"] = 1.0 + w(r)
        t[a + "kv_b_proj.weight"] = w(heads * (nope + vd), r)
        t[a + "o_proj.weight"] = w(d, heads * vd)
        grouped_moe(t, p + "mlp.", i == 0, w, (d, dense, e, h))
    write_model(out, t, config, tokenizer_dir)


def make_glm(out, tokenizer_dir):
    """A random GLM-4-MoE-shaped model (GLM-4.5's layout, scaled down):
    partial rotary embedding, q/k norms and biases, grouped sigmoid routing
    with a correction bias, a shared expert, a dense first layer."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    d, heads, kv, hd, e, h, dense, v, layers = 1024, 16, 4, 64, 32, 512, 2048, 320, 8
    config = {"model_type": "glm4_moe", "vocab_size": v, "hidden_size": d,
              "intermediate_size": dense, "moe_intermediate_size": h,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "head_dim": hd, "partial_rotary_factor": 0.5,
              "n_routed_experts": e, "num_experts_per_tok": 4, "n_group": 4,
              "topk_group": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
              "routed_scaling_factor": 2.5, "norm_topk_prob": True, "use_qk_norm": True,
              "attention_bias": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
              "max_position_embeddings": 4096, "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    rng = np.random.default_rng(3)

    def w(*shape, scale=0.03):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    t = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": 1.0 + w(d),
         "lm_head.weight": w(v, d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        biased_attention(t, p, w, (d, heads, kv, hd))
        t[a + "q_norm.weight"] = 1.0 + w(hd)
        t[a + "k_norm.weight"] = 1.0 + w(hd)
        grouped_moe(t, p + "mlp.", i == 0, w, (d, dense, e, h))
    write_model(out, t, config, tokenizer_dir)


def make_gpt_oss(out, tokenizer_dir):
    """A random gpt-oss-shaped model as OpenAI ships one: MXFP4 experts
    (quantized by MLX), biases, sinks, sliding and full layers."""
    import mlx.core as mx
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    d, heads, kv, hd, e, h, v, layers = 1024, 16, 4, 64, 32, 512, 320, 8
    config = {"model_type": "gpt_oss", "vocab_size": v, "hidden_size": d,
              "intermediate_size": h, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
              "num_local_experts": e, "num_experts_per_tok": 4, "sliding_window": 128,
              "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
              "attention_bias": True, "swiglu_limit": 7.0, "rms_norm_eps": 1e-5,
              "rope_theta": 150000.0,
              "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                               "beta_slow": 1.0, "original_max_position_embeddings": 4096},
              "max_position_embeddings": 131072, "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
              "quantization_config": {"quant_method": "mxfp4"}}
    rng = np.random.default_rng(2)

    def w(*shape, scale=0.03):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    def mxfp4(a):
        packed, scales = mx.quantize(mx.array(a), group_size=32, bits=4, mode="mxfp4")
        shape = a.shape[:-1] + (a.shape[-1] // 32, 16)
        return np.array(packed).view(np.uint8).reshape(shape), np.array(scales)

    t = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": 1.0 + w(d),
         "lm_head.weight": w(v, d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        biased_attention(t, p, w, (d, heads, kv, hd))
        t[a + "o_proj.bias"] = w(d)
        t[a + "sinks"] = w(heads, scale=1.0)
        m = p + "mlp."
        t[m + "router.weight"] = w(e, d, scale=0.5)
        t[m + "router.bias"] = w(e, scale=0.1)
        blocks, scales = mxfp4(w(e, 2 * h, d))
        t[m + "experts.gate_up_proj_blocks"], t[m + "experts.gate_up_proj_scales"] = blocks, scales
        t[m + "experts.gate_up_proj_bias"] = w(e, 2 * h)
        blocks, scales = mxfp4(w(e, d, h))
        t[m + "experts.down_proj_blocks"], t[m + "experts.down_proj_scales"] = blocks, scales
        t[m + "experts.down_proj_bias"] = w(e, d)
    write_model(out, t, config, tokenizer_dir)


def make_qwen3_moe(out, tokenizer_dir):
    """A random Qwen3-MoE-shaped model (Qwen3-30B-A3B's layout, scaled
    down: q/k norms, softmax routing renormalised over the top 4 of 32
    experts of 512), every row a multiple of 256 so that llama.cpp's
    K-quants apply: the float model `bench moe quantized` converts to
    mlx-community's 4-bit layout and to GGUF Q4_K_M."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    d, heads, kv, hd, e, h, v, layers = 1024, 16, 4, 64, 32, 512, 320, 8
    config = {"model_type": "qwen3_moe", "vocab_size": v, "hidden_size": d,
              "intermediate_size": 2048, "moe_intermediate_size": h,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "head_dim": hd, "num_experts": e,
              "num_experts_per_tok": 4, "norm_topk_prob": True,
              "decoder_sparse_step": 1, "mlp_only_layers": [],
              "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 4096,
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
              "torch_dtype": "float32"}
    rng = np.random.default_rng(4)

    def w(*shape, scale=0.03):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    t = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": 1.0 + w(d),
         "lm_head.weight": w(v, d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        t[p + "input_layernorm.weight"] = 1.0 + w(d)
        t[p + "post_attention_layernorm.weight"] = 1.0 + w(d)
        t[a + "q_proj.weight"] = w(heads * hd, d)
        t[a + "k_proj.weight"] = w(kv * hd, d)
        t[a + "v_proj.weight"] = w(kv * hd, d)
        t[a + "o_proj.weight"] = w(d, heads * hd)
        t[a + "q_norm.weight"] = 1.0 + w(hd)
        t[a + "k_norm.weight"] = 1.0 + w(hd)
        t[p + "mlp.gate.weight"] = w(e, d, scale=0.5)
        for x in range(e):
            for name, shape in [("gate_proj", (h, d)), ("up_proj", (h, d)),
                                ("down_proj", (d, h))]:
                t[p + f"mlp.experts.{x}.{name}.weight"] = w(*shape)
    write_model(out, t, config, tokenizer_dir)
