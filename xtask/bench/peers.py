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
    peers.py make-qwen3-moe DIR TOKENIZER_DIR
                                 a random Qwen3-MoE-shaped model (D 1024, 8
                                 layers, 16 heads of 64, 4 KV heads, q/k
                                 norms, 32 experts of 512, top-4)
    peers.py quantize-mlx DIR OUT
                                 mlx-lm's converter: DIR at 4 bits, groups
                                 of 64, into OUT (mlx-community's layout)
    peers.py gguf-q4km DIR GGUF
                                 the Qwen3-MoE of DIR as llama.cpp's Q4_K_M
                                 (F32 GGUF under llama.cpp's names, then
                                 llama.cpp's quantizer)
    peers.py llama-cpp-peer GGUF OUT PROMPT DECODE THREADS [REPEATS]
                                 llama.cpp on GGUF, one JSON line as
                                 moe-peer's
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

from bench_models import make_deepseek, make_glm, make_gpt_oss, make_moe, make_qwen3_moe
from quantized_models import gguf_q4km, quantize_mlx


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


def llama_cpp_peer(gguf_path, out, n_prompt, decode, threads, repeats="3"):
    ids, decode = prompt(int(n_prompt), 320), int(decode)
    pre, dec = run_llama_cpp(gguf_path, ids, decode, threads, int(repeats))
    row = {"impl": "llama.cpp", "backend": "none", "ranks": 1, "threads": threads,
           "model": gguf_path, "weights": "GGUF as stored", "prompt_tokens": len(ids),
           "decode_tokens": decode, "prefill_tokens_per_s": len(ids) / median(pre),
           "decode_tokens_per_s": median(dec)}
    with open(out, "a") as f:
        print(json.dumps(row))
        f.write(json.dumps(row) + "\n")


def weights(hf_dir):
    """The experts' stored form: "mxfp4" for gpt-oss as shipped, MLX's
    affine bits for an mlx-community directory, else "f32"."""
    config = json.loads((Path(hf_dir) / "config.json").read_text())
    q = config.get("quantization")
    if q:
        return f"{q['bits']}-bit affine (groups of {q['group_size']})"
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


def run_llama_cpp(gguf_path, ids, decode, threads, repeats=3):
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

    return bench(prefill, steps, repeats)


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
    if sys.argv[1] == "make-qwen3-moe":
        return make_qwen3_moe(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "quantize-mlx":
        return quantize_mlx(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "gguf-q4km":
        return gguf_q4km(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "llama-cpp-peer":
        return llama_cpp_peer(*sys.argv[2:8])
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
