#!/usr/bin/env python3
"""The peers of `cargo xtask bench generate`, on the same weights.

    peers.py convert GGUF DIR    write the GGUF's tensors, dequantized to
                                 float32 (q/k rows back in Hugging Face
                                 order), as a Hugging Face directory for mlx-lm
    peers.py run GGUF DIR OUT PROMPT DECODE THREADS
                                 mlx-lm on DIR and llama.cpp on GGUF: prefill
                                 of PROMPT tokens and DECODE greedy steps;
                                 appends one JSON line per peer to OUT

The prompt is the token ids (i * 7919) % 20000 + 100, as bench_generate's.
THREADS is "1" or "all"; the caller sets OPENBLAS_NUM_THREADS for MLX.
"""

import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def convert(gguf_path, out):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.numpy import save_file

    r = GGUFReader(gguf_path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
    arch = meta["general.architecture"]
    heads, kv = meta[f"{arch}.attention.head_count"], meta[f"{arch}.attention.head_count_kv"]
    layer = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    top = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    tensors = {}
    for t in r.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        if t.name in top:
            name = top[t.name]
        else:
            _, i, module, suffix = t.name.split(".")
            name = f"model.layers.{i}.{layer[module]}.{suffix}"
            if arch == "llama" and module in ("attn_q", "attn_k"):
                n = heads if module == "attn_q" else kv
                w = w.reshape(n, w.shape[0] // n // 2, 2, -1).swapaxes(1, 2).reshape(shape)
        tensors[name] = np.ascontiguousarray(w)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors")
    config = {
        "model_type": arch, "hidden_size": meta[f"{arch}.embedding_length"],
        "intermediate_size": meta[f"{arch}.feed_forward_length"],
        "num_hidden_layers": meta[f"{arch}.block_count"],
        "num_attention_heads": heads, "num_key_value_heads": kv,
        "rms_norm_eps": meta[f"{arch}.attention.layer_norm_rms_epsilon"],
        "rope_theta": meta[f"{arch}.rope.freq_base"],
        "vocab_size": tensors["model.embed_tokens.weight"].shape[0],
        "max_position_embeddings": meta[f"{arch}.context_length"],
        "tie_word_embeddings": "lm_head.weight" not in tensors,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))


def prompt(n):
    return [(i * 7919) % 20000 + 100 for i in range(n)]


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


def run_mlx_lm(hf_dir, ids, decode):
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

    return bench(prefill, steps)


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
    gguf_path, hf_dir, out, n_prompt, decode, threads = sys.argv[2:8]
    ids, decode = prompt(int(n_prompt)), int(decode)
    rows = []
    for impl, weights, fn in [
        ("mlx-lm", "dequantized f32 (same values)", lambda: run_mlx_lm(hf_dir, ids, decode)),
        ("llama.cpp", "Q4_1/Q8_0 GGUF as stored", lambda: run_llama_cpp(gguf_path, ids, decode, threads)),
    ]:
        pre, dec = fn()
        rows.append({"impl": impl, "backend": "none", "ranks": 1, "threads": threads,
                     "weights": weights, "prompt_tokens": len(ids), "decode_tokens": decode,
                     "prefill_tokens_per_s": len(ids) / median(pre),
                     "decode_tokens_per_s": median(dec)})
    with open(out, "a") as f:
        for row in rows:
            print(json.dumps(row))
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
