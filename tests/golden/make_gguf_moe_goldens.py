#!/usr/bin/env python3
"""GGUF MoE goldens: llama.cpp's stacked experts, quantized by llama.cpp.

- gguf/moe-CASE-FTYPE.gguf: a tiny MoE (`qwen3moe`; `qwen2moe` with its
  gated shared expert, `ffn_*_shexp`, the gate `ffn_gate_inp_shexp` [D];
  Mixtral as `llama` with `expert_count`) written as F32 by the gguf package's writer under
  llama.cpp's names (router `ffn_gate_inp`, experts stacked as
  `ffn_gate_exps`/`ffn_up_exps` [E, H, D] and `ffn_down_exps` [E, D, H];
  q/k rows reordered for `llama`), checked against llama.cpp itself (its
  logits of the F32 file equal mlx-lm's of the float model), then
  quantized by llama.cpp (`llama_model_quantize` through
  llama-cpp-python) to Q4_K_M (layer 0's down experts in Q6_K, the rest
  Q4_K), and the Qwen3-MoE to Q8_0.
- gguf/moe-CASE-FTYPE.safetensors: the prompt ("tokens") and mlx-lm's
  logits of the same model with every tensor of that file dequantized by
  the gguf package ("logits").

    ~/.cache/golden-venv/bin/pip install "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" \\
        gguf numpy safetensors llama-cpp-python==0.3.16
    ~/.cache/golden-venv/bin/python tests/golden/make_gguf_moe_goldens.py
"""

import json
import tempfile
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
from gguf import quants
from mlx_lm.utils import load_model
from safetensors.numpy import save_file

from make_gguf_goldens import gguf_name, write_gguf
from make_kquant_goldens import PROMPT, unpermute, vocabulary

HERE = Path(__file__).parent
OUT = HERE / "gguf"
BASE = {
    "vocab_size": 320, "hidden_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2,
}
EXPERTS, TOP_K, HIDDEN = 4, 2, 256
# (GGUF architecture, Hugging Face config, where the block's tensors are)
CASES = {
    "qwen3moe": ("qwen3moe", {
        "model_type": "qwen3_moe", "intermediate_size": 512,
        "num_experts": EXPERTS, "num_experts_per_tok": TOP_K,
        "moe_intermediate_size": HIDDEN, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": []}, "mlp"),
    "qwen2moe": ("qwen2moe", {
        "model_type": "qwen2_moe", "intermediate_size": 512,
        "num_experts": EXPERTS, "num_experts_per_tok": TOP_K,
        "moe_intermediate_size": HIDDEN, "shared_expert_intermediate_size": HIDDEN,
        "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": []}, "mlp"),
    "mixtral": ("llama", {
        "model_type": "mixtral", "intermediate_size": HIDDEN,
        "num_local_experts": EXPERTS, "num_experts_per_tok": TOP_K},
        "block_sparse_moe"),
}
# llama.cpp's llama_ftype values.
FTYPES = {"Q4_K_M": 15, "Q8_0": 7}


def float_tensors(config, seed):
    """The model under llama.cpp's layout and mlx-lm's names (the experts
    stacked as `mlp.switch_mlp`, which both read)."""
    rng = np.random.default_rng(seed)
    d, v, hd = config["hidden_size"], config["vocab_size"], config["head_dim"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    w = lambda *shape, scale=0.08: (rng.standard_normal(shape) * scale).astype(np.float32)
    t = {"model.embed_tokens.weight": w(v, d, scale=0.5),
         "model.norm.weight": 1.0 + w(d, scale=0.1), "lm_head.weight": w(v, d)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1.0 + w(d, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1.0 + w(d, scale=0.1)
        t[p + "self_attn.q_proj.weight"] = w(heads * hd, d)
        t[p + "self_attn.k_proj.weight"] = w(kv * hd, d)
        t[p + "self_attn.v_proj.weight"] = w(kv * hd, d)
        t[p + "self_attn.o_proj.weight"] = w(d, heads * hd)
        if config["model_type"] == "qwen3_moe":
            t[p + "self_attn.q_norm.weight"] = 1.0 + w(hd, scale=0.1)
            t[p + "self_attn.k_norm.weight"] = 1.0 + w(hd, scale=0.1)
        if config["model_type"] == "qwen2_moe":
            for n, rows in [("q", heads * hd), ("k", kv * hd), ("v", kv * hd)]:
                t[p + f"self_attn.{n}_proj.bias"] = w(rows, scale=0.1)
            t[p + "mlp.shared_expert.gate_proj.weight"] = w(HIDDEN, d)
            t[p + "mlp.shared_expert.up_proj.weight"] = w(HIDDEN, d)
            t[p + "mlp.shared_expert.down_proj.weight"] = w(d, HIDDEN)
            t[p + "mlp.shared_expert_gate.weight"] = w(1, d, scale=0.3)
        t[p + "mlp.gate.weight"] = w(EXPERTS, d, scale=0.3)
        t[p + "mlp.switch_mlp.gate_proj.weight"] = w(EXPERTS, HIDDEN, d)
        t[p + "mlp.switch_mlp.up_proj.weight"] = w(EXPERTS, HIDDEN, d)
        t[p + "mlp.switch_mlp.down_proj.weight"] = w(EXPERTS, d, HIDDEN)
    return t


def mlx_logits(config, block, tensors, tmp):
    """mlx-lm's logits of the prompt for `tensors` (the block's tensors
    renamed to where mlx-lm's family has them)."""
    hf = Path(tempfile.mkdtemp(dir=tmp))
    (hf / "config.json").write_text(json.dumps(config))
    named = {n.replace(".mlp.", f".{block}."): t for n, t in tensors.items()}
    save_file(named, hf / "model.safetensors", metadata={"format": "pt"})
    model, _ = load_model(hf)
    return np.array(model(mx.array([PROMPT]))[0].astype(mx.float32))


def llama_cpp_logits(path):
    """llama.cpp's logits of the prompt for the GGUF at `path`."""
    import llama_cpp

    # A float32 KV cache (llama.cpp's default is float16).
    f32 = llama_cpp.GGML_TYPE_F32
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=64,
                          type_k=f32, type_v=f32, verbose=False)
    llm.eval(PROMPT)
    return np.array(llm.scores[:len(PROMPT)], dtype=np.float32)


def check_and_quantize(stem, config, write_f32, tensors, ftype, restore):
    """The golden pair gguf/STEM.gguf and .safetensors: writes the F32 GGUF
    with `write_f32(path)`, checks that llama.cpp's logits of it equal
    mlx-lm's of `tensors` (config `config`), quantizes it with llama.cpp
    to `ftype` (a llama_ftype value), and saves mlx-lm's logits of
    `restore(values)` (every tensor of the quantized file dequantized by
    the gguf package, by its llama.cpp name)."""
    import llama_cpp

    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "f32.gguf"
        write_f32(f32)
        want = mlx_logits(config, "mlp", tensors, tmp)
        gap = np.abs(llama_cpp_logits(f32) - want).max() / np.abs(want).max()
        assert gap < 1e-4, f"{stem}: llama.cpp and mlx-lm differ by {gap}"
        path = OUT / f"{stem}.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        rc = llama_cpp.llama_model_quantize(str(f32).encode(), str(path).encode(), params)
        assert rc == 0, f"llama_model_quantize {stem}: {rc}"
        values, types = {}, {}
        for t in gguf.GGUFReader(path).tensors:
            v = quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            values[t.name] = v.reshape([int(d) for d in reversed(t.shape)])
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        logits = mlx_logits(config, "mlp", restore(values), tmp)
        save_file({"tokens": np.array(PROMPT, dtype=np.int32), "logits": logits},
                  OUT / f"{stem}.safetensors")
        print(f"{path.name}: {path.stat().st_size} bytes, types {types}, "
              f"llama.cpp F32 vs mlx-lm {gap:.1e}")


def write_and_check(stem, arch, config, tensors, gguf_name, metadata, ftype):
    """check_and_quantize of the float model `tensors` written as F32
    under `gguf_name`'s names for architecture `arch`, `metadata(w)`
    adding its keys (and any tensor of its own) first."""
    def write(path):
        w = gguf.GGUFWriter(path, arch)
        metadata(w)
        for name, t in sorted(tensors.items()):
            w.add_tensor(gguf_name(name), np.ascontiguousarray(t))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    by_gguf = {gguf_name(n): n for n in tensors}
    check_and_quantize(stem, config, write, tensors, ftype,
                       lambda values: {by_gguf[n]: v.reshape(tensors[by_gguf[n]].shape)
                                       for n, v in values.items() if n in by_gguf})


def dequantized(path, arch, config, names):
    """Every tensor of the GGUF at `path` as floats under `names`' names."""
    by_gguf = {gguf_name(n): n for n in names}
    out, types = {}, {}
    for t in gguf.GGUFReader(path).tensors:
        values = quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        name = by_gguf[t.name]
        values = values.reshape(names[name].shape)
        if arch == "llama" and name.endswith("q_proj.weight"):
            values = unpermute(values, config["num_attention_heads"])
        if arch == "llama" and name.endswith("k_proj.weight"):
            values = unpermute(values, config["num_key_value_heads"])
        out[name] = values
        key = f"{t.tensor_type.name}"
        types[key] = types.get(key, 0) + 1
    return out, types


def main():
    import llama_cpp

    for seed, (case, (arch, extra, block)) in enumerate(sorted(CASES.items())):
        config = {**BASE, **extra}
        tensors = float_tensors(config, 11 + seed)

        def metadata(w):
            vocabulary(w, config["vocab_size"])
            w.add_expert_count(EXPERTS)
            w.add_expert_used_count(TOP_K)
            if arch != "llama":
                w.add_expert_feed_forward_length(HIDDEN)
            if "shared_expert_intermediate_size" in config:
                w.add_expert_shared_feed_forward_length(HIDDEN)

        # llama.cpp takes the shared expert's gate as a vector.
        squeezed = {n: t[0] if n.endswith("shared_expert_gate.weight") else t
                    for n, t in tensors.items()}
        with tempfile.TemporaryDirectory() as tmp:
            f32 = Path(tmp) / "f32.gguf"
            write_gguf(f32, arch, config, squeezed, extra=metadata)
            want = mlx_logits(config, block, tensors, tmp)
            got = llama_cpp_logits(f32)
            gap = np.abs(got - want).max() / np.abs(want).max()
            assert gap < 1e-4, f"{case}: llama.cpp and mlx-lm differ by {gap}"
            for ftype, code in FTYPES.items():
                if ftype == "Q8_0" and case != "qwen3moe":
                    continue  # one is enough: the files are large
                path = OUT / f"moe-{case}-{ftype}.gguf"
                params = llama_cpp.llama_model_quantize_default_params()
                params.ftype = code
                rc = llama_cpp.llama_model_quantize(
                    str(f32).encode(), str(path).encode(), params)
                assert rc == 0, f"llama_model_quantize {case} {ftype}: {rc}"
                floats, types = dequantized(path, arch, config, tensors)
                logits = mlx_logits(config, block, floats, tmp)
                save_file({"tokens": np.array(PROMPT, dtype=np.int32), "logits": logits},
                          OUT / f"moe-{case}-{ftype}.safetensors")
                print(f"{path.name}: {path.stat().st_size} bytes, types {types}, "
                      f"llama.cpp F32 vs mlx-lm {gap:.1e}")


if __name__ == "__main__":
    main()
