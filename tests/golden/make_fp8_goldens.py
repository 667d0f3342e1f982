#!/usr/bin/env python3
"""An FP8 DeepSeek-V3 in the original release's layout, and mlx-lm's logits.

Writes tests/golden/fp8/deepseek-v3/: the tiny DeepSeek-V3 of
make_moe_goldens.py as DeepSeek ships V3/R1 (and Moonshot Kimi K2):
every linear weight of attention and experts (`*_proj.weight`, 2-D) as
`F8_E4M3` with `*.weight_scale_inv` (`F32`, one scale per 128x128 tile,
edges padded), the rest (embeddings, norms, the router, the score
correction bias) in `F32`, and config.json's `quantization_config`
(`quant_method` `fp8`, `weight_block_size` [128, 128]).
golden.safetensors: the prompt ("tokens") and mlx-lm's logits ("logits",
F32 [T, V]) of that directory, which mlx-lm dequantizes in
`deepseek_v3.py`'s sanitize (to bfloat16) and, as MLX's CPU `gather_mm`
takes only float32, runs in float32. The scales are powers of two
(`2^ceil(log2(max|tile| / 448))`), so that every dequantized value (3
mantissa bits times a power of two) is exact in bfloat16 and the two
readers hold the same weights.

    ~/.cache/golden-venv/bin/pip install "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" \\
        numpy safetensors ml_dtypes
    ~/.cache/golden-venv/bin/python tests/golden/make_fp8_goldens.py
"""

import json
import shutil
import struct
from pathlib import Path

import ml_dtypes
import mlx.core as mx
import numpy as np
from mlx_lm.utils import load_model
from safetensors.numpy import load_file, save_file

HERE = Path(__file__).parent
SOURCE = HERE / "moe" / "deepseek-v3"
OUT = HERE / "fp8" / "deepseek-v3"
BLOCK = 128


def fp8_blocks(w):
    """`w` [m, n] as F8_E4M3 values and their F32 scale per tile."""
    m, n = w.shape
    tiles = (-(-m // BLOCK), -(-n // BLOCK))
    scales = np.zeros(tiles, dtype=np.float32)
    q = np.zeros((m, n), dtype=ml_dtypes.float8_e4m3fn)
    for i in range(tiles[0]):
        for j in range(tiles[1]):
            tile = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            scale = 2.0 ** np.ceil(np.log2(max(float(np.abs(tile).max()) / 448.0, 1e-12)))
            scales[i, j] = scale
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = (
                tile / scale).astype(ml_dtypes.float8_e4m3fn)
    return q, scales


def write_safetensors(path, tensors):
    """A safetensors file with dtypes numpy's writer lacks (F8_E4M3, BF16)."""
    names = {np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
             np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.float32): "F32"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        raw = a.tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def main():
    config = json.loads((SOURCE / "config.json").read_text())
    layers = config["num_hidden_layers"]
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                     "activation_scheme": "dynamic",
                                     "weight_block_size": [BLOCK, BLOCK]}
    out = {}
    for name, w in load_file(SOURCE / "model.safetensors").items():
        if int(name.split(".")[2]) >= layers if name.startswith("model.layers.") else False:
            continue  # the multi-token-prediction layer: mlx-lm keeps none
        if name.endswith("_proj.weight") and w.ndim == 2:
            out[name], out[name + "_scale_inv"] = fp8_blocks(w)
        else:
            out[name] = w.astype(np.float32)
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    (OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(OUT / "model.safetensors", out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SOURCE / name, OUT / name)
    prompt = load_file(SOURCE / "golden.safetensors")["tokens"]
    model, _ = load_model(OUT)
    model.set_dtype(mx.float32)
    logits = model(mx.array([prompt.tolist()]))[0].astype(mx.float32)
    save_file({"tokens": prompt, "logits": np.array(logits)}, OUT / "golden.safetensors")
    print(f"fp8/deepseek-v3: {sum(n.endswith('_scale_inv') for n in out)} FP8 weights, "
          f"argmax {np.array(logits).argmax(-1).tolist()}")


if __name__ == "__main__":
    main()
