#!/usr/bin/env python3
"""Tiny random mixture-of-experts models and their logits from mlx-lm.

Writes, for each case below (and a float copy of gpt-oss), a Hugging Face model directory under
tests/golden/moe/CASE/: config.json, model.safetensors with Hugging Face
tensor names (per-expert tensors, or gpt-oss's stacked MXFP4 ones, as the
models ship), a small byte-level
BPE tokenizer.json trained here (so `generate --model DIR` runs on them),
and golden.safetensors holding a prompt ("tokens", I32) and mlx-lm's
logits for it ("logits", F32 [T, V]). The Rust tests load the same
directories with safemlx-dist at 1-4 ranks, both expert placements, and
compare.

Run once, commit the output; CI needs no Python:

    python3 -m venv /tmp/golden && /tmp/golden/bin/pip install \
        "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" numpy safetensors tokenizers
    /tmp/golden/bin/python tests/golden/make_moe_goldens.py
"""

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.utils import load_model
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

OUT = Path(__file__).parent / "moe"
VOCAB = 320
TEXT = [
    "The experts of a mixture split across ranks; each token visits its top experts.",
    "Tensor parallel attention, expert parallel feed forward, one all to all each way.",
    "Hello world. A small model answers a small question with a few tokens.",
    "Routing on the device keeps the host out of the loop for every token.",
] * 4

BASE = {
    "vocab_size": VOCAB,
    "hidden_size": 48,
    "num_hidden_layers": 2,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 4096,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}

CASES = {
    # 6 experts: uneven over 4 ranks (2 + 2 + 1 + 1); top-k then softmax.
    "mixtral": dict(model_type="mixtral", num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=40,
                    num_local_experts=6, num_experts_per_tok=2,
                    rope_theta=1000000.0, sliding_window=None),
    # Qwen3-MoE: q/k norms, head_dim 16, top-3 of 8 renormalised, layer 0
    # a dense MLP (mlp_only_layers).
    "qwen3-moe": dict(model_type="qwen3_moe", num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16,
                      intermediate_size=64, moe_intermediate_size=24,
                      num_experts=8, num_experts_per_tok=3,
                      norm_topk_prob=True, decoder_sparse_step=1,
                      mlp_only_layers=[0], rope_theta=1000000.0),
    # Qwen2-MoE: q/k/v biases, top-2 of 5 without renormalising, a shared
    # expert behind a sigmoid gate.
    "qwen2-moe": dict(model_type="qwen2_moe", num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64,
                      moe_intermediate_size=24,
                      shared_expert_intermediate_size=40, num_experts=5,
                      num_experts_per_tok=2, norm_topk_prob=False,
                      decoder_sparse_step=1, mlp_only_layers=[],
                      rope_theta=1000000.0),
    # GLM-4-MoE: half of each head rotated, q/k norms, q/k/v biases, layer
    # 0 dense, then sigmoid routing: top-3 of 8 experts within the best 2
    # of 4 groups, a correction bias, routed scaling 2.5, one shared
    # expert; a multi-token-prediction layer after the last (not read).
    "glm4-moe": dict(model_type="glm4_moe", num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, partial_rotary_factor=0.5,
                     intermediate_size=64, moe_intermediate_size=24,
                     n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                     topk_group=2, n_shared_experts=1,
                     first_k_dense_replace=1, routed_scaling_factor=2.5,
                     norm_topk_prob=True, use_qk_norm=True,
                     attention_bias=True, scoring_func="sigmoid",
                     topk_method="noaux_tc", num_nextn_predict_layers=1,
                     rope_theta=10000.0, rope_scaling=None),
    # DeepSeek-V3: latent attention (a query latent, kv latent 16, 8 + 4
    # dims per query/key head, values of 12; 4 heads, uneven over 3
    # ranks), YaRN with mscale_all_dim (the softmax scale and the
    # rotation scaled), layer 0 dense, then GLM's routing; a
    # multi-token-prediction layer after the last (not read).
    "deepseek-v3": dict(model_type="deepseek_v3", num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=4,
                        q_lora_rank=24, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=4,
                        v_head_dim=12, intermediate_size=64,
                        moe_intermediate_size=24, n_routed_experts=8,
                        num_experts_per_tok=3, n_group=4, topk_group=2,
                        n_shared_experts=1, first_k_dense_replace=1,
                        moe_layer_freq=1, routed_scaling_factor=2.5,
                        norm_topk_prob=True, scoring_func="sigmoid",
                        topk_method="noaux_tc", attention_bias=False,
                        num_nextn_predict_layers=1, rope_theta=10000.0,
                        rope_scaling={"type": "yarn", "factor": 4.0,
                                      "original_max_position_embeddings": 64,
                                      "beta_fast": 32, "beta_slow": 1,
                                      "mscale": 1.0, "mscale_all_dim": 0.8}),
    # DeepSeek-V3 without a query latent (q_proj), MoE on every second
    # layer (moe_layer_freq 2: layers 0 and 2), top-2 of 6 experts in one
    # group without renormalising, no shared expert, plain RoPE.
    "deepseek-v3-lite": dict(model_type="deepseek_v3", num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=4,
                             q_lora_rank=None, kv_lora_rank=16,
                             qk_nope_head_dim=8, qk_rope_head_dim=4,
                             v_head_dim=12, intermediate_size=64,
                             moe_intermediate_size=24, n_routed_experts=6,
                             num_experts_per_tok=2, n_group=1, topk_group=1,
                             n_shared_experts=None, first_k_dense_replace=0,
                             moe_layer_freq=2, routed_scaling_factor=1.0,
                             norm_topk_prob=False, scoring_func="sigmoid",
                             topk_method="noaux_tc", attention_bias=False,
                             rope_theta=10000.0, rope_scaling=None),
    # gpt-oss as OpenAI ships it: experts in MXFP4 (`*_blocks`, `*_scales`)
    # with biases, gate and up interleaved in `gate_up_proj`, the clamped
    # SwiGLU; a router with a bias, top-3 of 6 (uneven over 4 ranks);
    # attention sinks, q/k/v/o biases, sliding windows of 4 around a
    # full-attention layer (the prompt is longer), YaRN.
    "gpt-oss": dict(model_type="gpt_oss", hidden_size=64, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=96, num_local_experts=6,
                    num_experts_per_tok=3, sliding_window=4,
                    layer_types=["sliding_attention", "full_attention",
                                 "sliding_attention"],
                    attention_bias=True, swiglu_limit=7.0, rope_theta=150000.0,
                    rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                  "original_max_position_embeddings": 64,
                                  "beta_fast": 32.0, "beta_slow": 1.0},
                    quantization_config={
                        "quant_method": "mxfp4",
                        "modules_to_not_convert": [
                            "model.layers.*.self_attn", "model.layers.*.mlp.router",
                            "model.embed_tokens", "lm_head"]}),
}

# The same gpt-oss in float32 as Transformers holds it dequantized
# (`gate_up_proj` [E, D, 2H], `down_proj` [E, H, D]): mlx-lm does not read
# that layout, so its goldens are the MXFP4 model's (the dequantized values
# are exact in float32).
FLOAT_COPIES = {"gpt-oss-float": "gpt-oss"}

# Each case's weights seed (fixed, so adding a case leaves the others'
# weights as they were).
SEEDS = {"mixtral": 100, "qwen2-moe": 101, "qwen3-moe": 102, "glm4-moe": 103,
         "deepseek-v3": 104, "deepseek-v3-lite": 105, "gpt-oss": 106}


def latent_attention(config, p, w):
    """DeepSeek's latent-attention tensors of one layer under prefix p."""
    d, heads = config["hidden_size"], config["num_attention_heads"]
    nope, rope = config["qk_nope_head_dim"], config["qk_rope_head_dim"]
    r, v = config["kv_lora_rank"], config["v_head_dim"]
    t = {}
    if config["q_lora_rank"]:
        ql = config["q_lora_rank"]
        t[p + "q_a_proj.weight"] = w(ql, d)
        t[p + "q_a_layernorm.weight"] = 1.0 + w(ql, scale=0.1)
        t[p + "q_b_proj.weight"] = w(heads * (nope + rope), ql)
    else:
        t[p + "q_proj.weight"] = w(heads * (nope + rope), d)
    t[p + "kv_a_proj_with_mqa.weight"] = w(r + rope, d)
    t[p + "kv_a_layernorm.weight"] = 1.0 + w(r, scale=0.1)
    t[p + "kv_b_proj.weight"] = w(heads * (nope + v), r)
    t[p + "o_proj.weight"] = w(d, heads * v)
    return t


def mxfp4(w):
    """A float [..., rows, columns] as OpenAI's MXFP4 tensors: `blocks`
    uint8 [..., rows, columns / 32, 16] (two 4-bit values a byte, the
    first in the low bits) and `scales` uint8 [..., rows, columns / 32]
    (powers of two, biased by 127), quantized by MLX; and the values they
    hold, dequantized by MLX."""
    packed, scales = mx.quantize(mx.array(w), group_size=32, bits=4, mode="mxfp4")
    values = mx.dequantize(packed, scales, group_size=32, bits=4,
                           mode="mxfp4").astype(mx.float32)
    shape = w.shape[:-1] + (w.shape[-1] // 32, 16)
    blocks = np.array(packed).view(np.uint8).reshape(shape)
    return blocks, np.array(scales), np.array(values)


def gpt_oss_layer(config, p, w):
    """gpt-oss's attention and experts of one layer under prefix p; with
    the experts' dequantized values in Transformers' float layout."""
    d, heads = config["hidden_size"], config["num_attention_heads"]
    kv, hd = config["num_key_value_heads"], config["head_dim"]
    e, h = config["num_local_experts"], config["intermediate_size"]
    t, floats = {}, {}
    a = p + "self_attn."
    for name, rows in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
        t[a + name + ".weight"] = w(rows, d)
        t[a + name + ".bias"] = w(rows, scale=0.1)
    t[a + "o_proj.weight"] = w(d, heads * hd)
    t[a + "o_proj.bias"] = w(d, scale=0.1)
    t[a + "sinks"] = w(heads, scale=1.0)
    m = p + "mlp."
    t[m + "router.weight"] = w(e, d, scale=0.5)
    t[m + "router.bias"] = w(e, scale=0.5)
    # Gates large enough that the SwiGLU's clamp at 7 bites.
    blocks, scales, gate_up = mxfp4(w(e, 2 * h, d, scale=1.0))
    t[m + "experts.gate_up_proj_blocks"] = blocks
    t[m + "experts.gate_up_proj_scales"] = scales
    t[m + "experts.gate_up_proj_bias"] = w(e, 2 * h, scale=0.5)
    blocks, scales, down = mxfp4(w(e, d, h, scale=0.05))
    t[m + "experts.down_proj_blocks"] = blocks
    t[m + "experts.down_proj_scales"] = scales
    t[m + "experts.down_proj_bias"] = w(e, d, scale=0.1)
    floats[m + "experts.gate_up_proj"] = np.ascontiguousarray(gate_up.transpose(0, 2, 1))
    floats[m + "experts.down_proj"] = np.ascontiguousarray(down.transpose(0, 2, 1))
    return t, floats


def dense_layer(config, i):
    """Whether layer i keeps a dense MLP."""
    return (i in config.get("mlp_only_layers", [])
            or i < config.get("first_k_dense_replace", 0)
            or i % config.get("moe_layer_freq", 1) != 0)


def weights(config, rng):
    d, v = config["hidden_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim", d // heads)
    family = config["model_type"]

    def w(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t = {"model.embed_tokens.weight": w(v, d, scale=0.15),
         "model.norm.weight": (1.0 + w(d, scale=0.1)),
         "lm_head.weight": w(v, d, scale=0.2)}
    floats = {}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1.0 + w(d, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1.0 + w(d, scale=0.1)
        if family == "gpt_oss":
            layer, layer_floats = gpt_oss_layer(config, p, w)
            t.update(layer)
            floats.update(layer_floats)
            continue
        if family == "deepseek_v3":
            t.update(latent_attention(config, p + "self_attn.", w))
        else:
            t[p + "self_attn.q_proj.weight"] = w(heads * hd, d)
            t[p + "self_attn.k_proj.weight"] = w(kv * hd, d)
            t[p + "self_attn.v_proj.weight"] = w(kv * hd, d)
            t[p + "self_attn.o_proj.weight"] = w(d, heads * hd)
        if family in ("qwen2_moe", "glm4_moe"):
            t[p + "self_attn.q_proj.bias"] = w(heads * hd, scale=0.1)
            t[p + "self_attn.k_proj.bias"] = w(kv * hd, scale=0.1)
            t[p + "self_attn.v_proj.bias"] = w(kv * hd, scale=0.1)
        if family in ("qwen3_moe", "glm4_moe"):
            t[p + "self_attn.q_norm.weight"] = 1.0 + w(hd, scale=0.1)
            t[p + "self_attn.k_norm.weight"] = 1.0 + w(hd, scale=0.1)
        if family == "mixtral":
            e, h = config["num_local_experts"], config["intermediate_size"]
            m = p + "block_sparse_moe."
            t[m + "gate.weight"] = w(e, d, scale=0.5)
            for x in range(e):
                t[m + f"experts.{x}.w1.weight"] = w(h, d)
                t[m + f"experts.{x}.w3.weight"] = w(h, d)
                t[m + f"experts.{x}.w2.weight"] = w(d, h)
        elif dense_layer(config, i):
            h = config["intermediate_size"]
            t[p + "mlp.gate_proj.weight"] = w(h, d)
            t[p + "mlp.up_proj.weight"] = w(h, d)
            t[p + "mlp.down_proj.weight"] = w(d, h)
        else:
            e = config.get("num_experts") or config["n_routed_experts"]
            h = config["moe_intermediate_size"]
            m = p + "mlp."
            t[m + "gate.weight"] = w(e, d, scale=0.5)
            if family in ("glm4_moe", "deepseek_v3"):
                t[m + "gate.e_score_correction_bias"] = w(e, scale=0.3)
            if config.get("n_shared_experts"):
                hs = h * config["n_shared_experts"]
                t[m + "shared_experts.gate_proj.weight"] = w(hs, d)
                t[m + "shared_experts.up_proj.weight"] = w(hs, d)
                t[m + "shared_experts.down_proj.weight"] = w(d, hs)
            for x in range(e):
                t[m + f"experts.{x}.gate_proj.weight"] = w(h, d)
                t[m + f"experts.{x}.up_proj.weight"] = w(h, d)
                t[m + f"experts.{x}.down_proj.weight"] = w(d, h)
            if "shared_expert_intermediate_size" in config:
                hs = config["shared_expert_intermediate_size"]
                t[m + "shared_expert.gate_proj.weight"] = w(hs, d)
                t[m + "shared_expert.up_proj.weight"] = w(hs, d)
                t[m + "shared_expert.down_proj.weight"] = w(d, hs)
                t[m + "shared_expert_gate.weight"] = w(1, d, scale=0.5)
    if config.get("num_nextn_predict_layers") and family != "deepseek_v3":
        # A multi-token-prediction layer's tensor, as GLM-4.5 ships one.
        mtp = f"model.layers.{config['num_hidden_layers']}."
        t[mtp + "eh_proj.weight"] = w(d, 2 * d)
    return t, floats


def mtp_tensors(config):
    """A multi-token-prediction layer's tensors, as DeepSeek-V3 ships them
    after the last layer."""
    d = config["hidden_size"]
    mtp = f"model.layers.{config['num_hidden_layers']}."
    rng = np.random.default_rng(7)
    return {mtp + "eh_proj.weight": rng.standard_normal((d, 2 * d)).astype(np.float32),
            mtp + "enorm.weight": np.ones(d, dtype=np.float32)}


def tokenizer():
    """A byte-level BPE of at most VOCAB tokens, specials first."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB,
                                  special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT, trainer)
    assert tok.get_vocab_size() <= VOCAB
    return tok


def main():
    tok = tokenizer()
    prompt = tok.encode("Hello experts, route the tokens.").ids
    for case, extra in sorted(CASES.items()):
        config = {**BASE, **extra}
        path = OUT / case
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        tensors, floats = weights(config, np.random.default_rng(SEEDS[case]))
        # mlx-lm drops GLM's multi-token-prediction layer, not a tiny
        # DeepSeek's (it drops only layer 61): add it after the goldens.
        deepseek = config["model_type"] == "deepseek_v3"
        mtp = mtp_tensors(config) if deepseek and config.get("num_nextn_predict_layers") else {}
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
        tok.save(str(path / "tokenizer.json"))
        (path / "tokenizer_config.json").write_text(json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>"}, indent=2) + "\n")
        model, _ = load_model(path)
        logits = model(mx.array([prompt]))[0].astype(mx.float32)
        golden = {"tokens": np.array(prompt, dtype=np.int32),
                  "logits": np.array(logits)}
        save_file(golden, path / "golden.safetensors")
        if mtp:
            save_file({**tensors, **mtp}, path / "model.safetensors",
                      metadata={"format": "pt"})
        print(f"{case}: {len(prompt)} tokens, logits {golden['logits'].shape}, "
              f"argmax {golden['logits'].argmax(-1).tolist()}")
        for copy in (c for c, of in FLOAT_COPIES.items() if of == case):
            write_float_copy(path, OUT / copy, tensors, floats)
            print(f"{copy}: {case} in float32, the same goldens")


def write_float_copy(source, path, tensors, floats):
    """The model at `source` with its quantized experts replaced by their
    float values (`floats`), its goldens and tokenizer copied."""
    path.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    del config["quantization_config"]
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    kept = {k: v for k, v in tensors.items()
            if not k.endswith(("_blocks", "_scales"))}
    save_file({**kept, **floats}, path / "model.safetensors", metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "golden.safetensors"):
        (path / name).write_bytes((source / name).read_bytes())


if __name__ == "__main__":
    main()
