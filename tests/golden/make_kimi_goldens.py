#!/usr/bin/env python3
"""Kimi K2's layout: `model_type` `kimi_k2` (DeepSeek-V3's model, as
mlx-lm remaps it) with a tiktoken vocabulary, and token ids from OpenAI's
`tiktoken` package.

Writes tests/golden/kimi/kimi-k2/: the tiny DeepSeek-V3 of
make_moe_goldens.py (its weights and goldens) with config.json's
`model_type` `kimi_k2`, and the tokenizer as Moonshot ships it:
`tiktoken.model` (one `base64(bytes) rank` per line: the 256 bytes, then
the MoE goldens' BPE merges in order) and tokenizer_config.json with its
special tokens in `added_tokens_decoder` (ids after the ranks) and no
tokenizer.json. tokens.json: texts and the ids `tiktoken` gives for them
with Kimi's split pattern (`pat_str` of `tokenization_kimi.py`: Han runs,
cased words with class intersections, digits by 1 to 3, a lookahead for
trailing spaces) and the special tokens allowed.

    ~/.cache/golden-venv/bin/pip install tiktoken tokenizers safetensors numpy
    ~/.cache/golden-venv/bin/python tests/golden/make_kimi_goldens.py
"""

import base64
import json
import shutil
from pathlib import Path

import tiktoken

from make_moe_goldens import tokenizer

HERE = Path(__file__).parent
SOURCE = HERE / "moe" / "deepseek-v3"
OUT = HERE / "kimi" / "kimi-k2"
# tokenization_kimi.py's pat_str.
PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
SPECIAL = ["[BOS]", "[EOS]", "<|im_end|>"]
TEXTS = [
    "Hello experts, route the tokens.",
    "The capital of France is Paris. 12345 apples",
    "  leading spaces and\nnew lines\ttabs   ",
    "DON'T shout; it's FINE.",
    "北京是中国的首都, naïve café",
    "[BOS]Hi<|im_end|>",
]


def byte_decoder():
    """GPT-2's printable characters back to bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def main():
    model = json.loads(tokenizer().to_str())["model"]
    decode = byte_decoder()
    ranks = {bytes([b]): b for b in range(256)}
    for merge in model["merges"]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        token = bytes(decode[c] for c in left + right)
        ranks.setdefault(token, len(ranks))
    special = {name: len(ranks) + i for i, name in enumerate(SPECIAL)}
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    config = json.loads((SOURCE / "config.json").read_text())
    config["model_type"] = "kimi_k2"
    (OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("model.safetensors", "golden.safetensors"):
        shutil.copy(SOURCE / name, OUT / name)
    with open(OUT / "tiktoken.model", "w") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    (OUT / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": {str(i): {"content": t, "special": True}
                                 for t, i in special.items()},
        "bos_token": "[BOS]", "eos_token": "[EOS]",
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
    }, indent=2) + "\n")
    enc = tiktoken.Encoding("kimi-style", pat_str=PAT_STR, mergeable_ranks=ranks,
                            special_tokens=special)
    golden = {"texts": TEXTS,
              "ids": [enc.encode(t, allowed_special="all") for t in TEXTS]}
    (OUT / "tokens.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")
    print(f"kimi-k2: {len(ranks)} ranks, specials {special}, ids {golden['ids'][0]}")


if __name__ == "__main__":
    main()
