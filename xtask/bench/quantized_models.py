"""The quantized forms of a float model that `cargo xtask bench moe
quantized` runs, each made by the real tool: mlx-community's 4-bit layout
by mlx-lm's converter, GGUF Q4_K_M by llama.cpp's quantizer (from an F32
GGUF under llama.cpp's names, written by the gguf package's writer as
tests/golden/make_gguf_moe_goldens.py does). `peers.py` calls these; see
its usage.
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).resolve().parents[2] / "tests" / "golden"


def quantize_mlx(float_dir, out, bits=4, group_size=64):
    """`mlx_lm.convert -q` of `float_dir` into `out`."""
    from mlx_lm import convert

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    convert(str(float_dir), str(out), quantize=True, q_bits=int(bits),
            q_group_size=int(group_size))


def vocabulary(writer, tokenizer_json, size):
    """The byte-level BPE of `tokenizer_json` as llama.cpp stores one,
    padded to `size` tokens."""
    model = json.loads(Path(tokenizer_json).read_text())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)[:size]
    tokens += [f"<unused{i}>" for i in range(size - len(tokens))]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i < 3 else 1 for i in range(len(tokens))])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m)
                             for m in model["merges"]])


def gguf_q4km(float_dir, out):
    """The Qwen3-MoE of `float_dir` as llama.cpp's Q4_K_M at `out`."""
    import llama_cpp
    from safetensors.numpy import load_file

    sys.path.insert(0, str(GOLDEN))
    from make_gguf_goldens import write_gguf

    float_dir = Path(float_dir)
    config = json.loads((float_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe", config["model_type"]
    t = load_file(float_dir / "model.safetensors")
    e = config["num_experts"]
    for i in range(config["num_hidden_layers"]):
        m = f"model.layers.{i}.mlp."
        for name in ["gate_proj", "up_proj", "down_proj"]:
            parts = [t.pop(f"{m}experts.{x}.{name}.weight") for x in range(e)]
            t[f"{m}switch_mlp.{name}.weight"] = np.stack(parts)

    def metadata(w):
        vocabulary(w, float_dir / "tokenizer.json", config["vocab_size"])
        w.add_expert_count(e)
        w.add_expert_used_count(config["num_experts_per_tok"])
        w.add_expert_feed_forward_length(config["moe_intermediate_size"])

    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "f32.gguf"
        write_gguf(f32, "qwen3moe", config, t, extra=metadata)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
        rc = llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), params)
        assert rc == 0, f"llama_model_quantize: {rc}"
