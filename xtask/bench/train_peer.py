#!/usr/bin/env python3
"""MLX Python's tensor-parallel training of the `train` example's model,
for `cargo xtask bench train`, launched as N ranks by safemlx-launch
(MLX reads the same MLX_RANK / MLX_HOSTFILE, or runs under mpirun).

    train_peer.py MODEL_DIR OUT SEQ STEPS BACKEND

MODEL_DIR is the Hugging Face directory the example wrote (`DIR/model`).
The model is mlx-lm's Llama on those weights, split the way mlx-lm and
MLX's distributed layers do it: q/k/v and gate/up as `all-to-sharded`
linears (which put `sum_gradients` on their input), o and down as
`sharded-to-all`, each rank its heads; the embedding and norms stay
replicated. Each step: next-byte cross-entropy over SEQ bytes of the same
generated corpus as the example, its gradient, clipping to norm 1 and an
AdamW step (lr 0.003, with bias correction as ours), evaluated. Two
warm-up steps, then STEPS timed ones; rank 0 appends one JSON line to OUT
and prints the first losses (the example's run on the same weights gives
the same first loss).

The `mlx[cpu]` wheel from PyPI ships the reference BLAS (netlib, about 5
GFLOPS here for a 1024^3 sgemm against about 90 with OpenBLAS); the bench
runs this script as shipped and with the system's OpenBLAS in LD_PRELOAD
(the same BLAS our MLX build links), and the row says which ("blas").
"""

import json
import os
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.nn.layers.distributed import shard_linear
from mlx_lm.models import llama

MASK64 = (1 << 64) - 1


def corpus():
    """The example's corpus: the same grammar and generator."""
    subjects = ["the cat", "a dog", "the bird", "my friend", "the child"]
    verbs = ["sees", "likes", "follows", "finds", "helps"]
    objects = ["the ball", "a tree", "the house", "the river", "a book"]
    state = 7
    text = ""

    def nxt(n):
        nonlocal state
        state = (state * 6364136223846793005 + 1) & MASK64
        return (state >> 33) % n

    while len(text) < 20000:
        s, v, o = nxt(5), nxt(5), nxt(5)
        text += f"{subjects[s]} {verbs[v]} {objects[o]}. "
    return text.encode()


def load(model_dir, group):
    config = json.loads((Path(model_dir) / "config.json").read_text())
    args = llama.ModelArgs.from_dict(config)
    model = llama.Model(args)
    model.load_weights(list(mx.load(str(Path(model_dir) / "model.safetensors")).items()))
    n = group.size()
    if n > 1:
        for layer in model.model.layers:
            a, m = layer.self_attn, layer.mlp
            a.q_proj = shard_linear(a.q_proj, "all-to-sharded", group=group)
            a.k_proj = shard_linear(a.k_proj, "all-to-sharded", group=group)
            a.v_proj = shard_linear(a.v_proj, "all-to-sharded", group=group)
            a.o_proj = shard_linear(a.o_proj, "sharded-to-all", group=group)
            a.n_heads //= n
            a.n_kv_heads //= n
            m.gate_proj = shard_linear(m.gate_proj, "all-to-sharded", group=group)
            m.up_proj = shard_linear(m.up_proj, "all-to-sharded", group=group)
            m.down_proj = shard_linear(m.down_proj, "sharded-to-all", group=group)
    mx.eval(model.parameters())
    return model, config


def main():
    model_dir, out, seq, steps, backend = sys.argv[1:6]
    seq, steps = int(seq), int(steps)
    mx.set_default_device(mx.cpu)
    expected = int(os.environ.get("MLX_WORLD_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)
    # One rank needs no backend (under mpirun, MLX would initialise MPI and
    # exit without finalising it, which mpirun reports as a failure).
    group = mx.distributed.init(strict=expected > 1, backend=backend if expected > 1 else "ring")
    if group.size() != expected:
        sys.exit(f"train_peer.py: MLX formed a group of {group.size()} ranks, expected {expected}")
    model, config = load(model_dir, group)
    text = corpus()
    windows = (len(text) - seq - 1) // seq

    def loss_fn(model, x, y):
        logits = model(x)
        return nn.losses.cross_entropy(logits, y, reduction="mean")

    step_fn = nn.value_and_grad(model, loss_fn)
    # PyTorch's AdamW, as ours: bias correction on (MLX defaults to off).
    opt = optim.AdamW(learning_rate=0.003, bias_correction=True)
    times, losses = [], []
    for step in range(steps + 2):
        at = (step % windows) * seq
        x = mx.array(list(text[at:at + seq]))[None]
        y = mx.array(list(text[at + 1:at + seq + 1]))[None]
        started = time.perf_counter()
        loss, grads = step_fn(model, x, y)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state, loss)
        seconds = time.perf_counter() - started
        losses.append(loss.item())
        if step >= 2:
            times.append(seconds)
    if group.rank() != 0:
        return
    times.sort()
    step_s = times[len(times) // 2]
    row = {
        "bench": "train",
        "impl": "mlx-python",
        "backend": backend,
        "ranks": group.size(),
        "tensor_parallel": group.size(),
        "data_parallel": 1,
        "threads": 1,
        "width": config["hidden_size"],
        "hidden": config["intermediate_size"],
        "layers": config["num_hidden_layers"],
        "seq": seq,
        "step_ms": step_s * 1e3,
        "tokens_per_s": seq / step_s,
        "first_losses": losses[:3],
        "mlx": mx.__version__,
        "blas": "openblas" if "openblas" in os.environ.get("LD_PRELOAD", "") else "bundled",
    }
    print(
        f"mlx-python ({row['blas']} BLAS) {backend} x{group.size()}: {step_s * 1e3:.1f} ms per step, "
        f"{seq / step_s:.0f} tokens/s; first losses {[round(v, 5) for v in losses[:3]]}",
        flush=True,
    )
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
