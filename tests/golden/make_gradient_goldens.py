#!/usr/bin/env python3
"""Gradients of tiny Llama-family models from mlx-lm, for tests/tests/gradients.rs.

For each case below (models written by make_llama_goldens.py, and the MoE
models of make_moe_goldens.py), loads the
model with mlx-lm, takes the loss sum(logits * c) over the prompt with
c[t, v] = sin(0.1 * (t * V + v)), and writes gradients.safetensors in the
case's directory: "loss" and "grad_norm" (the global norm of the gradient
over every parameter, F32 [1]). The Rust test computes the same loss with
safemlx-dist at 1 to 4 ranks (KV heads shared by several ranks included)
and compares both numbers.

Run once, commit the output; CI needs no Python (same venv as
make_llama_goldens.py):

    /tmp/golden/bin/python tests/golden/make_gradient_goldens.py [CASE ...]

With case names (directory names), only those are written.
"""

import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model
from safetensors.numpy import save_file

ROOT = Path(__file__).parent / "llama"
MOE_ROOT = Path(__file__).parent / "moe"
PROMPT = [1, 5, 17, 33, 2, 60, 66, 12, 40]
CASES = [ROOT / c for c in ["llama-tied-kv3", "qwen2-bias", "qwen3-qknorm", "llama3-kv1-sharded"]]
CASES += [MOE_ROOT / c for c in ["mixtral", "qwen3-moe", "qwen2-moe"]]
# The families of make_moe_goldens.py's second half: latent attention and
# grouped routing; partial rotary embedding and q/k norms; sinks, biases
# and a biased router (its MXFP4 experts frozen on both sides, their biases
# trained).
CASES += [MOE_ROOT / c for c in ["deepseek-v3", "glm4-moe", "gpt-oss"]]


def main():
    only = set(sys.argv[1:])
    for case in CASES:
        if only and case.name not in only:
            continue
        # mlx-lm keeps a tiny DeepSeek's multi-token-prediction tensors
        # (it drops only layer 61's) and refuses them strictly: not strict.
        model, _ = load_model(case, strict=case.name != "deepseek-v3")
        tokens = mx.array([PROMPT])
        vocab = model.args.vocab_size
        index = mx.arange(len(PROMPT) * vocab).reshape(len(PROMPT), vocab)
        c = mx.sin(0.1 * index.astype(mx.float32))

        def loss_fn(m):
            return (m(tokens)[0] * c).sum()

        loss, grads = nn.value_and_grad(model, loss_fn)(model)
        norm = mx.sqrt(sum((g * g).sum() for _, g in tree_flatten(grads)))
        mx.eval(loss, norm)
        save_file(
            {
                "loss": np.array([loss.item()], dtype=np.float32),
                "grad_norm": np.array([norm.item()], dtype=np.float32),
            },
            str(case / "gradients.safetensors"),
        )
        print(case.name, loss.item(), norm.item(), len(tree_flatten(grads)), "arrays")


if __name__ == "__main__":
    main()
