#!/usr/bin/env python3
"""MoE models as mlx-community ships them: quantized by mlx-lm's own
converter, and their logits from mlx-lm.

For each case below: a tiny random MoE in Hugging Face's layout (the
tensors of make_moe_goldens.py, with dimensions that MLX's quantization
groups divide) is written to a temporary directory, and `mlx_lm.convert`
(`quantize=True`, the case's bits and group size) turns it into
tests/golden/mlx-community/CASE/ exactly as `mlx_lm.convert -q` writes an
mlx-community directory: mlx-lm's tensor names (the experts stacked as
`switch_mlp`), `weight` (uint32) / `scales` / `biases` for every quantized
layer (embedding, attention, experts, router, LM head) and
`quantization` in config.json. GPT_OSS_CASES convert the committed
gpt-oss of make_moe_goldens.py (OpenAI's layout: MXFP4 experts
`*_blocks` / `*_scales`, interleaved `gate_up_proj`) as mlx-lm converts
OpenAI's release for mlx-community: the experts de-interleaved into
`experts.gate_proj` / `up_proj` / `down_proj` (`weight` uint32, `scales`
uint8, `bias`) and kept in MLX's `mxfp4` mode (`"mode": "mxfp4"` at the
top of `quantization`); with `-q`, every other linear layer affine by a
per-module entry (the router at 8 bits in groups of 64). golden.safetensors holds the prompt
("tokens", I32) and mlx-lm's logits of the converted model ("logits",
F32 [T, V]).

Run once, commit the output; CI needs no Python:

    python3 -m venv ~/.cache/golden-venv && ~/.cache/golden-venv/bin/pip install \\
        "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" numpy safetensors tokenizers
    ~/.cache/golden-venv/bin/python tests/golden/make_mlx_community_goldens.py
"""

import json
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm import convert
from mlx_lm.utils import load_model
from safetensors.numpy import save_file

from make_moe_goldens import BASE, tokenizer, weights

OUT = Path(__file__).parent / "mlx-community"

CASES = {
    # Qwen3-MoE in 4 bits, groups of 64: top-2 of 8 experts renormalised,
    # q/k norms; heads 64 wide (a group each), as Qwen3's 128 are two.
    "qwen3-moe-4bit": (dict(model_type="qwen3_moe", hidden_size=128,
                            num_attention_heads=4, num_key_value_heads=2,
                            head_dim=64, intermediate_size=128,
                            moe_intermediate_size=64, num_experts=8,
                            num_experts_per_tok=2, norm_topk_prob=True,
                            decoder_sparse_step=1, mlp_only_layers=[],
                            rope_theta=1000000.0),
                       4, 64, 11),
    # Mixtral in 8 bits, groups of 32: top-2 of 6 experts (uneven over 4
    # ranks).
    "mixtral-8bit": (dict(model_type="mixtral", hidden_size=128,
                          num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=96, num_local_experts=6,
                          num_experts_per_tok=2, rope_theta=1000000.0,
                          sliding_window=None),
                     8, 32, 12),
    # DeepSeek-V3 in 4 bits, groups of 32: mlx-lm splits each layer's
    # kv_b_proj into per-head `embed_q` and `unembed_out` (quantized too),
    # a query latent, grouped sigmoid routing, a shared expert, layer 0
    # dense.
    "deepseek-v3-4bit": (dict(model_type="deepseek_v3", hidden_size=128,
                              num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=4, q_lora_rank=64,
                              kv_lora_rank=64, qk_nope_head_dim=32,
                              qk_rope_head_dim=16, v_head_dim=32,
                              intermediate_size=128, moe_intermediate_size=64,
                              n_routed_experts=8, num_experts_per_tok=2,
                              n_group=4, topk_group=2, n_shared_experts=1,
                              first_k_dense_replace=1, moe_layer_freq=1,
                              routed_scaling_factor=2.5, norm_topk_prob=True,
                              scoring_func="sigmoid", topk_method="noaux_tc",
                              attention_bias=False, rope_theta=10000.0,
                              rope_scaling=None),
                         4, 32, 13),
}

# gpt-oss converted from OpenAI's layout: (quantize the rest?, bits,
# group, mode); "gpt-oss-all-mxfp4" puts every layer in MLX's mxfp4 mode
# (`mlx_lm.convert -q --q-mode mxfp4`).
GPT_OSS_CASES = {
    "gpt-oss-mxfp4": (False, None, None, None),
    "gpt-oss-mxfp4-q4": (True, 4, 32, "affine"),
    "gpt-oss-all-mxfp4": (True, None, None, "mxfp4"),
}

# Every layer in one of MLX's other modes: a directory this crate refuses
# by name, so no logits.
REFUSED_MODES = {"gpt-oss-all-nvfp4": "nvfp4"}


def save_golden(path, prompt):
    model, _ = load_model(path)
    logits = model(mx.array([prompt]))[0].astype(mx.float32)
    golden = {"tokens": np.array(prompt, dtype=np.int32),
              "logits": np.array(logits)}
    save_file(golden, path / "golden.safetensors")
    return golden


def convert_gpt_oss(prompt):
    source = Path(__file__).parent / "moe" / "gpt-oss"
    for case, (quantize, bits, group, mode) in sorted(GPT_OSS_CASES.items()):
        path = OUT / case
        if path.exists():
            shutil.rmtree(path)
        if quantize:
            convert(str(source), str(path), quantize=True, q_bits=bits,
                    q_group_size=group, q_mode=mode)
        else:
            convert(str(source), str(path))
        (path / "README.md").unlink(missing_ok=True)
        golden = save_golden(path, prompt)
        print(f"{case}: {len(prompt)} tokens, "
              f"argmax {golden['logits'].argmax(-1).tolist()}")
    for case, mode in sorted(REFUSED_MODES.items()):
        path = OUT / case
        if path.exists():
            shutil.rmtree(path)
        convert(str(source), str(path), quantize=True, q_mode=mode)
        (path / "README.md").unlink(missing_ok=True)
        print(f"{case}: every layer in mode {mode}")


def main():
    tok = tokenizer()
    prompt = tok.encode("Hello experts, route the tokens.").ids
    convert_gpt_oss(prompt)
    for case, (extra, bits, group, seed) in sorted(CASES.items()):
        config = {**BASE, **extra}
        path = OUT / case
        with tempfile.TemporaryDirectory() as hf:
            hf = Path(hf)
            (hf / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            tensors, _ = weights(config, np.random.default_rng(seed))
            save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})
            tok.save(str(hf / "tokenizer.json"))
            (hf / "tokenizer_config.json").write_text(json.dumps(
                {"bos_token": "<s>", "eos_token": "</s>"}, indent=2) + "\n")
            if path.exists():
                shutil.rmtree(path)
            convert(str(hf), str(path), quantize=True, q_bits=bits,
                    q_group_size=group)
            # mlx-lm's model card, not part of the model.
            (path / "README.md").unlink(missing_ok=True)
        golden = save_golden(path, prompt)
        print(f"{case}: {bits} bits, groups of {group}; {len(prompt)} tokens, "
              f"argmax {golden['logits'].argmax(-1).tolist()}")


if __name__ == "__main__":
    main()
