#!/usr/bin/env python3
"""Quantized goldens: tiny Llama-family models as mlx-community and GGUF
ship them, and their logits from mlx-lm.

- quantized/CASE/: a Hugging Face directory in mlx-community's layout
  (config.json with "quantization": {"group_size", "bits"}; every linear
  layer and the embedding as `weight` (uint32), `scales`, `biases`),
  quantized by mlx-lm itself (`nn.quantize`), and golden.safetensors with
  the prompt ("tokens") and mlx-lm's logits of the quantized model
  ("logits"): mlx-lm's QuantizedLinear / QuantizedEmbedding layers.
- quantized/llama-q4_1.gguf: a tiny `llama` GGUF (llama.cpp's q/k row
  order) whose projections are Q4_1 and embedding Q8_0, as SmolLM2's file,
  written by the `gguf` package; quantized/llama-q4_1.safetensors: mlx-lm's
  logits for the same model with the gguf package's dequantized values of
  those blocks (an exact mapping keeps them quantized and gives these).

    /root/.cache/golden-venv/bin/pip install "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" \\
        gguf numpy safetensors
    /root/.cache/golden-venv/bin/python tests/golden/make_quantized_goldens.py
"""

import json
import tempfile
from pathlib import Path

import gguf
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model
from safetensors.numpy import save_file

HERE = Path(__file__).parent
OUT = HERE / "quantized"
PROMPT = [1, 5, 17, 33, 2, 60, 66, 12, 40]

BASE = {
    "vocab_size": 67,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}

CASES = {
    # Tied, 4 bits in groups of 32; 3 hidden groups (2 + 1 over 2 ranks,
    # none on rank 3 of 4); head_dim 32: one group per head.
    "llama-tied-q4": (dict(model_type="llama", num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=96,
                           tie_word_embeddings=True), 32, 4),
    # q/k norms, 8 bits in groups of 64, untied LM head, 3 hidden groups.
    "qwen3-q8": (dict(model_type="qwen3", num_attention_heads=2,
                      num_key_value_heads=1, head_dim=64, intermediate_size=192,
                      tie_word_embeddings=False, rope_theta=1000000.0), 64, 8),
}


def weights(config, rng):
    d, h, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim", d // heads)

    def w(*shape, scale=0.15):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": 1.0 + w(d, scale=0.1)}
    if not config["tie_word_embeddings"]:
        t["lm_head.weight"] = w(v, d)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1.0 + w(d, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1.0 + w(d, scale=0.1)
        t[p + "self_attn.q_proj.weight"] = w(heads * hd, d)
        t[p + "self_attn.k_proj.weight"] = w(kv * hd, d)
        t[p + "self_attn.v_proj.weight"] = w(kv * hd, d)
        t[p + "self_attn.o_proj.weight"] = w(d, heads * hd)
        if config["model_type"] == "qwen3":
            t[p + "self_attn.q_norm.weight"] = 1.0 + w(hd, scale=0.1)
            t[p + "self_attn.k_norm.weight"] = 1.0 + w(hd, scale=0.1)
        t[p + "mlp.gate_proj.weight"] = w(h, d)
        t[p + "mlp.up_proj.weight"] = w(h, d)
        t[p + "mlp.down_proj.weight"] = w(d, h)
    return t


def float_model(config, tensors):
    tmp = Path(tempfile.mkdtemp())
    (tmp / "config.json").write_text(json.dumps(config))
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    model, _ = load_model(tmp)
    return model


def logits(model):
    return np.array(model(mx.array([PROMPT]))[0].astype(mx.float32))


def write_mlx_community(case, extra, group_size, bits, seed):
    config = {**BASE, **extra}
    model = float_model(config, weights(config, np.random.default_rng(100 + seed)))
    nn.quantize(model, group_size=group_size, bits=bits)
    path = OUT / case
    path.mkdir(parents=True, exist_ok=True)
    config["quantization"] = {"group_size": group_size, "bits": bits}
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    params = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), params, metadata={"format": "mlx"})
    # Reload as a user would, and take its logits.
    model, _ = load_model(path)
    golden = {"tokens": np.array(PROMPT, dtype=np.int32), "logits": logits(model)}
    save_file(golden, path / "golden.safetensors")
    print(f"{case}: {len(params)} tensors, argmax {golden['logits'].argmax(-1).tolist()}")


def permute(w, heads):
    """llama.cpp's reordering of q/k rows for its interleaved RoPE."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_gguf():
    config = {**BASE, **CASES["llama-tied-q4"][0]}
    tensors = weights(config, np.random.default_rng(7))
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    w = gguf.GGUFWriter(OUT / "llama-q4_1.gguf", "llama")
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(config["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_vocab_size(config["vocab_size"])
    w.add_bos_token_id(config["bos_token_id"])
    w.add_eos_token_id(config["eos_token_id"])
    layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    dequantized = {}
    for name, t in sorted(tensors.items()):
        if name == "model.embed_tokens.weight":
            out, qtype = "token_embd.weight", T.Q8_0
        elif name == "model.norm.weight":
            out, qtype = "output_norm.weight", None
        else:
            _, _, i, rest = name.split(".", 3)
            module, suffix = rest.rsplit(".", 1)
            out = f"blk.{i}.{layer[module]}.{suffix}"
            qtype = None if "layernorm" in module else T.Q4_1
        stored = t
        if name.endswith("q_proj.weight"):
            stored = permute(t, heads)
        if name.endswith("k_proj.weight"):
            stored = permute(t, kv)
        stored = np.ascontiguousarray(stored)
        if qtype is None:
            w.add_tensor(out, stored)
            dequantized[name] = t
        else:
            blocks = quants.quantize(stored, qtype)
            w.add_tensor(out, blocks, raw_dtype=qtype)
            values = quants.dequantize(blocks, qtype).astype(np.float32)
            # Undo the q/k reordering: values in the original row order.
            if name.endswith("q_proj.weight") or name.endswith("k_proj.weight"):
                n = heads if name.endswith("q_proj.weight") else kv
                values = (values.reshape(n, values.shape[0] // n // 2, 2, -1)
                          .swapaxes(1, 2).reshape(values.shape))
            dequantized[name] = values
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    model = float_model(config, dequantized)
    golden = {"tokens": np.array(PROMPT, dtype=np.int32), "logits": logits(model)}
    save_file(golden, OUT / "llama-q4_1.safetensors")
    print(f"llama-q4_1.gguf: argmax {golden['logits'].argmax(-1).tolist()}")


def main():
    OUT.mkdir(exist_ok=True)
    for seed, (case, (extra, group_size, bits)) in enumerate(sorted(CASES.items())):
        write_mlx_community(case, extra, group_size, bits, seed)
    write_gguf()


if __name__ == "__main__":
    main()
