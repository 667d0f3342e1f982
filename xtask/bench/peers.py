#!/usr/bin/env python3
"""The peers of `cargo xtask bench generate`, on the same weights.

    peers.py convert GGUF DIR    write the GGUF's tensors, dequantized to
                                 float32 (q/k rows back in Hugging Face
                                 order), as a Hugging Face directory for mlx-lm
    peers.py convert-quantized GGUF DIR
                                 the same with the Q4_1/Q8_0 blocks kept
                                 quantized, as MLX's own GGUF loader maps them
                                 (affine, group 32; scales and biases as
                                 float32, the values our loader gives), in
                                 mlx-community's layout (per-layer bits)
    peers.py run GGUF DIR QDIR OUT PROMPT DECODE THREADS
                                 mlx-lm on DIR and on QDIR (its quantized
                                 layers) and llama.cpp on GGUF: prefill of
                                 PROMPT tokens and DECODE greedy steps;
                                 appends one JSON line per peer to OUT

    peers.py make-moe DIR TOKENIZER_DIR
                                 a random small Mixtral-layout model (D 512,
                                 4 layers, 8 experts of hidden 1024, top-2)
                                 with TOKENIZER_DIR's tokenizer, for
                                 `cargo xtask bench moe`
    peers.py make-deepseek DIR TOKENIZER_DIR
                                 a random DeepSeek-V3-shaped model (D 1024,
                                 8 layers, 16 heads, q_lora_rank 384,
                                 kv_lora_rank 256, 32 experts of 512 in 4
                                 groups, top-4, 1 shared expert, layer 0
                                 dense) for `cargo xtask bench moe`
    peers.py make-gpt-oss DIR TOKENIZER_DIR
                                 a random gpt-oss-shaped model as OpenAI
                                 ships one (D 1024, 8 layers, 16 heads of
                                 64, 4 KV heads, windows of 128 on every
                                 second layer, sinks, biases, 32 MXFP4
                                 experts of 512, top-4)
    peers.py make-glm DIR TOKENIZER_DIR
                                 a random GLM-4-MoE-shaped model (D 1024,
                                 8 layers, 16 heads of 64, 4 KV heads, half
                                 of each head rotated, q/k norms and biases,
                                 32 experts of 512 in 4 groups, top-4, 1
                                 shared expert, layer 0 dense)
    peers.py moe-peer DIR OUT PROMPT DECODE THREADS [REPEATS]
                                 mlx-lm on DIR, as `run` does (REPEATS timed
                                 runs after a warm-up, 3 by default)

    peers.py run GGUF DIR QDIR OUT PROMPT DECODE THREADS mlx-only
                                 the mlx-lm rows only
    peers.py graph DIR OUT PROMPT DECODE
                                 the host time mlx-lm takes to build one
                                 decode step's graph (the model's call,
                                 before anything is computed), after a
                                 prompt of PROMPT tokens; one JSON line

The prompt is the token ids ((i * 7919) % 20000 + 100) % V, as
bench_generate's (V the vocabulary size).
THREADS is "1" or "all"; the caller sets OPENBLAS_NUM_THREADS for MLX.

The mlx[cpu] wheel ships the reference BLAS (netlib); the caller runs the
mlx-lm rows as shipped and again with the system's OpenBLAS in LD_PRELOAD
(the BLAS our MLX build links), and each mlx-lm row says which ("blas").
"""

import json
import os
import sys
import time
from pathlib import Path

import numpy as np


LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
         "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
         "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def metadata(gguf_path):
    from gguf import GGUFReader

    r = GGUFReader(gguf_path)
    return r, {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}


def hf_module(name):
    """GGUF tensor stem -> (Hugging Face module, GGUF module)."""
    if name in TOP:
        return TOP[name], name
    _, i, module = name.split(".")
    return f"model.layers.{i}.{LAYER[module]}", module


def unpermute(w, meta, module):
    """llama.cpp's Q/K row order back to Hugging Face's (rows only, so the
    same for packed values, scales and biases)."""
    arch = meta["general.architecture"]
    if arch != "llama" or module not in ("attn_q", "attn_k"):
        return w
    n = meta[f"{arch}.attention.head_count" if module == "attn_q" else f"{arch}.attention.head_count_kv"]
    rows = w.shape[0]
    return w.reshape(n, rows // n // 2, 2, -1).swapaxes(1, 2).reshape(rows, -1)


def write_dir(out, meta, tensors, quantization=None):
    from safetensors.numpy import save_file

    arch = meta["general.architecture"]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors")
    config = {
        "model_type": arch, "hidden_size": meta[f"{arch}.embedding_length"],
        "intermediate_size": meta[f"{arch}.feed_forward_length"],
        "num_hidden_layers": meta[f"{arch}.block_count"],
        "num_attention_heads": meta[f"{arch}.attention.head_count"],
        "num_key_value_heads": meta[f"{arch}.attention.head_count_kv"],
        "rms_norm_eps": meta[f"{arch}.attention.layer_norm_rms_epsilon"],
        "rope_theta": meta[f"{arch}.rope.freq_base"],
        "vocab_size": tensors["model.embed_tokens.weight"].shape[0],
        "max_position_embeddings": meta[f"{arch}.context_length"],
        "tie_word_embeddings": "lm_head.weight" not in tensors,
    }
    if quantization:
        config["quantization"] = quantization
    (out / "config.json").write_text(json.dumps(config, indent=1))


def convert(gguf_path, out):
    from gguf.quants import dequantize

    r, meta = metadata(gguf_path)
    tensors = {}
    for t in r.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        stem, suffix = t.name.rsplit(".", 1)
        module, gguf_module = hf_module(stem)
        if w.ndim == 2:
            w = unpermute(w, meta, gguf_module)
        tensors[f"{module}.{suffix}"] = np.ascontiguousarray(w)
    write_dir(out, meta, tensors)


def convert_quantized(gguf_path, out):
    import mlx.core as mx

    _, meta = metadata(gguf_path)
    loaded = mx.load(gguf_path)
    tensors, quantization = {}, {"group_size": 32, "bits": 4}
    for key, value in loaded.items():
        stem, part = key.rsplit(".", 1)
        module, gguf_module = hf_module(stem)
        w = np.array(value.astype(mx.float32) if part != "weight" or value.dtype != mx.uint32 else value)
        if w.ndim == 2:
            w = unpermute(w, meta, gguf_module)
        tensors[f"{module}.{part}"] = np.ascontiguousarray(w)
        if part == "scales":
            # Packed words per row over groups per row: bits per value.
            bits = loaded[f"{stem}.weight"].shape[1] // value.shape[1]
            quantization[module] = {"group_size": 32, "bits": bits}
    write_dir(out, meta, tensors, quantization)


def prompt(n, vocab=1 << 30):
    return [((i * 7919) % 20000 + 100) % vocab for i in range(n)]


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


def blas():
    """The BLAS MLX runs on in this process: "openblas" when preloaded."""
    return "openblas" if "openblas" in os.environ.get("LD_PRELOAD", "") else "bundled"


def moe_peer(hf_dir, out, n_prompt, decode, threads, repeats="3"):
    ids, decode = prompt(int(n_prompt), 320), int(decode)
    pre, dec = run_mlx_lm(hf_dir, ids, decode, int(repeats))
    row = {"impl": "mlx-lm", "backend": "none", "ranks": 1, "threads": threads,
           "model": hf_dir, "weights": weights(hf_dir), "prompt_tokens": len(ids),
           "decode_tokens": decode, "prefill_tokens_per_s": len(ids) / median(pre),
           "decode_tokens_per_s": median(dec), "blas": blas()}
    with open(out, "a") as f:
        print(json.dumps(row))
        f.write(json.dumps(row) + "\n")


def weights(hf_dir):
    """The experts' stored form: "mxfp4" for gpt-oss as shipped, else "f32"."""
    config = json.loads((Path(hf_dir) / "config.json").read_text())
    return config.get("quantization_config", {}).get("quant_method", "f32")


def median(v):
    return sorted(v)[len(v) // 2]


def bench(step_prefill, step_decode, repeats=3):
    pre, dec = [], []
    for run in range(repeats + 1):
        t0 = time.perf_counter()
        token = step_prefill()
        t1 = time.perf_counter()
        steps = step_decode(token)
        t2 = time.perf_counter()
        if run:
            pre.append(t1 - t0)
            dec.append(steps / (t2 - t1))
    return pre, dec


def run_mlx_lm(hf_dir, ids, decode, repeats=3):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(hf_dir))
    state = {}

    def prefill():
        state["cache"] = make_prompt_cache(model)
        logits = model(mx.array([ids]), cache=state["cache"])
        token = mx.argmax(logits[0, -1]).item()
        return token

    def steps(token):
        for _ in range(decode):
            logits = model(mx.array([[token]]), cache=state["cache"])
            token = mx.argmax(logits[0, -1]).item()
        return decode

    return bench(prefill, steps, repeats)


def graph_mlx_lm(hf_dir, out, n_prompt, decode):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(hf_dir))
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt(int(n_prompt))]), cache=cache)
    token = mx.argmax(logits[0, -1]).item()
    times = []
    for _ in range(int(decode)):
        t0 = time.perf_counter()
        logits = model(mx.array([[token]]), cache=cache)
        last = mx.argmax(logits[0, -1])
        times.append(time.perf_counter() - t0)
        token = last.item()
    row = {"impl": "mlx-lm", "kind": "graph", "model": hf_dir, "prompt_tokens": int(n_prompt),
           "decode_graph_us": median(times[len(times) // 4:]) * 1e6,
           "mlx": mx.__version__}
    with open(out, "a") as f:
        print(json.dumps(row))
        f.write(json.dumps(row) + "\n")


def run_llama_cpp(gguf_path, ids, decode, threads):
    from llama_cpp import Llama

    n = os.cpu_count() if threads == "all" else 1
    llm = Llama(model_path=gguf_path, n_ctx=2048, n_batch=len(ids),
                n_threads=n, n_threads_batch=n, verbose=False)

    def last_logits():
        # The last position's logits (llama-cpp-python keeps no copy
        # unless logits_all, which would compute every position's).
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

    def prefill():
        llm.reset()
        llm.eval(ids)
        return int(np.argmax(last_logits()))

    def steps(token):
        for _ in range(decode):
            llm.eval([token])
            token = int(np.argmax(last_logits()))
        return decode

    return bench(prefill, steps)


def main():
    if sys.argv[1] == "convert":
        return convert(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "convert-quantized":
        return convert_quantized(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "make-moe":
        return make_moe(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "graph":
        return graph_mlx_lm(*sys.argv[2:6])
    if sys.argv[1] == "make-deepseek":
        return make_deepseek(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "make-gpt-oss":
        return make_gpt_oss(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "make-glm":
        return make_glm(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "moe-peer":
        return moe_peer(*sys.argv[2:8])
    gguf_path, hf_dir, quantized_dir, out, n_prompt, decode, threads = sys.argv[2:9]
    mlx_only = sys.argv[9:10] == ["mlx-only"]
    ids, decode = prompt(int(n_prompt)), int(decode)
    rows = []
    peers = [
        ("mlx-lm", "dequantized f32 (same values)", lambda: run_mlx_lm(hf_dir, ids, decode)),
        ("mlx-lm", "quantized", lambda: run_mlx_lm(quantized_dir, ids, decode)),
    ]
    if not mlx_only:
        peers.append(("llama.cpp", "Q4_1/Q8_0 GGUF as stored",
                      lambda: run_llama_cpp(gguf_path, ids, decode, threads)))
    for impl, weights, fn in peers:
        pre, dec = fn()
        row = {"impl": impl, "backend": "none", "ranks": 1, "threads": threads,
               "weights": weights, "prompt_tokens": len(ids), "decode_tokens": decode,
               "prefill_tokens_per_s": len(ids) / median(pre),
               "decode_tokens_per_s": median(dec)}
        if impl == "mlx-lm":
            row["blas"] = blas()
        rows.append(row)
    with open(out, "a") as f:
        for row in rows:
            print(json.dumps(row))
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
