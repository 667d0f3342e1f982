#!/usr/bin/env python3
"""K-quant goldens: llama.cpp's own quantizer, the gguf package's decoder.

- gguf/kquant-blocks.safetensors: random blocks of Q2_K, Q3_K, Q4_K, Q5_K,
  Q6_K and MXFP4 ("TYPE.bytes", U8 [blocks, block bytes]; their scales
  set to finite half floats) and the gguf package's `dequantize` of them
  ("TYPE.values", F32 [blocks, values per block]).
- gguf/kquant-FTYPE.gguf: a tiny `llama` (every row a multiple of 256
  values, as K-quants need; llama.cpp silently picks another type
  otherwise) written as F32 by the gguf package's writer (llama.cpp's
  names, q/k rows reordered for its RoPE) and quantized by llama.cpp
  itself (`llama_model_quantize` through llama-cpp-python) to Q4_K_M,
  Q5_K_M and Q6_K, which mix the K-quants (Q4_K_M keeps the LM head and
  some down projections in Q6_K); gguf/kquant-FTYPE.safetensors: the
  prompt ("tokens") and mlx-lm's logits of the same model with every
  tensor of that file dequantized by the gguf package ("logits").

    ~/.cache/golden-venv/bin/pip install "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" \\
        gguf numpy safetensors llama-cpp-python==0.3.16
    ~/.cache/golden-venv/bin/python tests/golden/make_kquant_goldens.py
"""

import json
import tempfile
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from mlx_lm.utils import load_model
from safetensors.numpy import save_file

from make_gguf_goldens import gguf_name, write_gguf
from make_moe_goldens import tokenizer

HERE = Path(__file__).parent
OUT = HERE / "gguf"
PROMPT = [1, 5, 17, 33, 2, 60, 66, 12, 40, 200, 7]
CONFIG = {
    "model_type": "llama", "vocab_size": 320, "hidden_size": 256,
    "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2,
}
# llama.cpp's llama_ftype values.
FTYPES = {"Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


def unpermute(w, heads):
    """Undoes llama.cpp's reordering of q/k rows (`permute`)."""
    return (w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_blocks():
    rng = np.random.default_rng(7)
    golden = {}
    for qtype in [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4]:
        per, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(4, size), dtype=np.uint8)
        half = lambda n: rng.uniform(0.01, 0.1, n).astype(np.float16).view(np.uint8)
        if qtype in (T.Q4_K, T.Q5_K):  # d, dmin first
            raw[:, 0:4] = half(8).reshape(4, 4)
        elif qtype == T.Q2_K:  # d, dmin last
            raw[:, 80:84] = half(8).reshape(4, 4)
        elif qtype in (T.Q3_K, T.Q6_K):  # d last
            raw[:, size - 2:] = half(4).reshape(4, 2)
        else:  # MXFP4: the exponent first, near 2^0
            raw[:, 0] = rng.integers(118, 132, 4, dtype=np.uint8)
        golden[f"{qtype.name}.bytes"] = raw
        golden[f"{qtype.name}.values"] = quants.dequantize(raw, qtype).astype(np.float32)
        assert golden[f"{qtype.name}.values"].shape == (4, per)
    save_file(golden, OUT / "kquant-blocks.safetensors")


def float_tensors():
    rng = np.random.default_rng(3)
    c = CONFIG
    d, h, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = d // c["num_attention_heads"]
    w = lambda *shape, scale=0.08: (rng.standard_normal(shape) * scale).astype(np.float32)
    t = {"model.embed_tokens.weight": w(v, d, scale=0.5),
         "model.norm.weight": 1.0 + w(d, scale=0.1), "lm_head.weight": w(v, d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1.0 + w(d, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1.0 + w(d, scale=0.1)
        t[p + "self_attn.q_proj.weight"] = w(c["num_attention_heads"] * hd, d)
        t[p + "self_attn.k_proj.weight"] = w(c["num_key_value_heads"] * hd, d)
        t[p + "self_attn.v_proj.weight"] = w(c["num_key_value_heads"] * hd, d)
        t[p + "self_attn.o_proj.weight"] = w(d, c["num_attention_heads"] * hd)
        t[p + "mlp.gate_proj.weight"] = w(h, d)
        t[p + "mlp.up_proj.weight"] = w(h, d)
        t[p + "mlp.down_proj.weight"] = w(d, h)
    return t


def vocabulary(w, size):
    """A byte-level vocabulary of `size` tokens: the MoE goldens' BPE of
    320 tokens padded, as llama.cpp stores one (specials `<pad>`, `<s>`,
    `</s>` of type 3, control)."""
    model = json.loads(tokenizer().to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    assert len(tokens) <= size
    tokens += [f"<unused{i}>" for i in range(size - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if i < 3 else 1 for i in range(len(tokens))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m)
                        for m in model["merges"]])


def write_f32(path, tensors):
    """The float model as GGUF with a byte-level vocabulary."""
    write_gguf(path, "llama", CONFIG, tensors,
               extra=lambda w: vocabulary(w, CONFIG["vocab_size"]))


def dequantized(path):
    """Every tensor of the GGUF at `path` as floats under HF names."""
    reader = gguf.GGUFReader(path)
    by_gguf = {gguf_name(n): n for n in float_tensors()}
    out, types = {}, {}
    for t in reader.tensors:
        values = quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        values = values.reshape([int(d) for d in reversed(t.shape)])
        name = by_gguf[t.name]
        if name.endswith("q_proj.weight"):
            values = unpermute(values, CONFIG["num_attention_heads"])
        if name.endswith("k_proj.weight"):
            values = unpermute(values, CONFIG["num_key_value_heads"])
        out[name] = values
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    return out, types


def main():
    import llama_cpp  # built from source by pip: only for the models

    OUT.mkdir(exist_ok=True)
    write_blocks()
    tensors = float_tensors()
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "f32.gguf"
        write_f32(f32, tensors)
        for name, ftype in FTYPES.items():
            path = OUT / f"kquant-{name}.gguf"
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = ftype
            rc = llama_cpp.llama_model_quantize(str(f32).encode(), str(path).encode(), params)
            assert rc == 0, f"llama_model_quantize {name}: {rc}"
            floats, types = dequantized(path)
            hf = Path(tmp) / name
            hf.mkdir()
            (hf / "config.json").write_text(json.dumps(CONFIG))
            save_file(floats, hf / "model.safetensors", metadata={"format": "pt"})
            model, _ = load_model(hf)
            logits = model(mx.array([PROMPT]))[0].astype(mx.float32)
            save_file({"tokens": np.array(PROMPT, dtype=np.int32), "logits": np.array(logits)},
                      OUT / f"kquant-{name}.safetensors")
            print(f"{path.name}: {path.stat().st_size} bytes, types {types}")


if __name__ == "__main__":
    main()
