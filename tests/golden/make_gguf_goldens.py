#!/usr/bin/env python3
"""GGUF goldens, written with the `gguf` package (llama.cpp's own writer).

- gguf/CASE.gguf: tiny models of tests/golden/llama/CASE in GGUF v3, F32,
  with llama.cpp's metadata names and, for `llama`, its reordering of the
  q/k rows for interleaved RoPE (as convert_hf_to_gguf.py does). Their
  logits must equal the Hugging Face directory's (mlx-lm's goldens).
- gguf/quants.gguf: one [4, 64] tensor in each of F32, F16, BF16, Q8_0,
  Q4_0 and Q4_1; gguf/quants-dequantized.safetensors: the gguf package's
  dequantized values of each.
- smollm2.json (only when SMOLLM2_GGUF names the real file): llama.cpp's
  (llama-cpp-python) token ids for a few texts and the rendered chat
  prompt, for the tokenizer built from the GGUF vocabulary.

    /tmp/golden/bin/pip install gguf llama-cpp-python numpy safetensors
    SMOLLM2_GGUF=~/.cache/safemlx-dist/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        /tmp/golden/bin/python tests/golden/make_gguf_goldens.py
"""

import json
import os
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from safetensors.numpy import load_file, save_file

HERE = Path(__file__).parent
OUT = HERE / "gguf"
TEXTS = [
    "Hello, world!",
    "The capital of France is Paris. 12345 apples",
    "  leading spaces and\nnew lines\ttabs",
    "<|im_start|>user\nHi<|im_end|>",
    "naïve café — ünïcödé ✓",
]


def permute(w, heads):
    """llama.cpp's reordering of q/k rows for its interleaved RoPE."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_factors(config):
    """convert_hf_to_gguf.py's rope_freqs for Llama 3 scaling."""
    r = config["rope_scaling"]
    dim = config["hidden_size"] // config["num_attention_heads"]
    base = config["rope_theta"]
    low = r["original_max_position_embeddings"] / r["low_freq_factor"]
    high = r["original_max_position_embeddings"] / r["high_freq_factor"]
    factors = []
    for freq in 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)):
        wavelen = 2 * np.pi / freq
        if wavelen < high:
            factors.append(1.0)
        elif wavelen > low:
            factors.append(r["factor"])
        else:
            smooth = (r["original_max_position_embeddings"] / wavelen - r["low_freq_factor"]) / (
                r["high_freq_factor"] - r["low_freq_factor"])
            factors.append(1 / ((1 - smooth) / r["factor"] + smooth))
    return np.array(factors, dtype=np.float32)


NAMES = {"model.embed_tokens.weight": "token_embd.weight",
         "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
         "mlp.gate": "ffn_gate_inp", "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
         "mlp.switch_mlp.up_proj": "ffn_up_exps", "mlp.switch_mlp.down_proj": "ffn_down_exps",
         "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
         "mlp.shared_expert.up_proj": "ffn_up_shexp",
         "mlp.shared_expert.down_proj": "ffn_down_shexp",
         "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}


def gguf_name(name):
    """llama.cpp's name of the Hugging Face tensor `name`."""
    if name in NAMES:
        return NAMES[name]
    _, _, i, rest = name.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{i}.{LAYER[module]}.{suffix}"


def write_gguf(path, arch, config, tensors, extra=None):
    """A GGUF of `tensors` (Hugging Face names, float32) for `config` as
    llama.cpp's converter writes one; `extra(writer)` adds more metadata
    (a vocabulary)."""
    w = gguf.GGUFWriter(path, arch)
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    if "head_dim" in config:
        w.add_key_length(config["head_dim"])
        w.add_value_length(config["head_dim"])
    w.add_rope_freq_base(config["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_vocab_size(config["vocab_size"])
    w.add_bos_token_id(config["bos_token_id"])
    w.add_eos_token_id(config["eos_token_id"])
    if extra:
        extra(w)
    if config.get("rope_scaling", {}).get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_factors(config))
    for name, t in sorted(tensors.items()):
        if arch == "llama" and name.endswith("q_proj.weight"):
            t = permute(t, heads)
        if arch == "llama" and name.endswith("k_proj.weight"):
            t = permute(t, kv)
        w.add_tensor(gguf_name(name), np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_model(case, arch):
    config = json.loads((HERE / "llama" / case / "config.json").read_text())
    tensors = {}
    for file in sorted((HERE / "llama" / case).glob("model*.safetensors")):
        tensors.update(load_file(file))
    write_gguf(OUT / f"{case}.gguf", arch, config, tensors)


def write_quants():
    rng = np.random.default_rng(42)
    x = (rng.standard_normal((4, 64)) * 0.7).astype(np.float32)
    w = gguf.GGUFWriter(OUT / "quants.gguf", "llama")
    golden = {}
    for qtype in [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1]:
        name = qtype.name.lower()
        if qtype == T.F32:
            data = x
        elif qtype == T.F16:
            data = x.astype(np.float16)
        else:
            data = quants.quantize(x, qtype)
        raw = None if qtype in (T.F32, T.F16) else qtype
        w.add_tensor(name, data, raw_dtype=raw)
        golden[name] = quants.dequantize(data, qtype).astype(np.float32) if raw else data.astype(np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_file(golden, OUT / "quants-dequantized.safetensors")


def write_tokenizer_golden(path):
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    ids = [llm.tokenize(t.encode(), add_bos=False, special=True) for t in TEXTS]
    template = llm.metadata["tokenizer.chat_template"]
    formatter = Jinja2ChatFormatter(template, eos_token="<|im_end|>", bos_token="<|im_start|>")
    chat = formatter(messages=[{"role": "user", "content": "What is the capital of France?"}]).prompt
    golden = {"texts": TEXTS, "ids": ids,
              "chat_message": "What is the capital of France?", "chat_prompt": chat,
              "chat_ids": llm.tokenize(chat.encode(), add_bos=False, special=True)}
    (HERE / "smollm2.json").write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")


def main():
    OUT.mkdir(exist_ok=True)
    # llama.cpp stores Mistral as `llama`.
    for case, arch in [("llama-tied-kv3", "llama"), ("llama3-kv1-sharded", "llama"),
                       ("mistral-kv2", "llama"), ("qwen2-bias", "qwen2"),
                       ("qwen3-qknorm", "qwen3")]:
        write_model(case, arch)
    write_quants()
    if os.environ.get("SMOLLM2_GGUF"):
        write_tokenizer_golden(Path(os.environ["SMOLLM2_GGUF"]).expanduser())
    for f in sorted(OUT.iterdir()):
        print(f.name, f.stat().st_size)


if __name__ == "__main__":
    main()
