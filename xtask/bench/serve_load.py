#!/usr/bin/env python3
"""The clients of `cargo xtask bench serve`: streaming chat completions
against any OpenAI-compatible server, timed on the client side.

    serve_load.py clients URL MODEL N TOKENS OUT LABELS
        after one untimed request, N clients at once, each streaming two
        greedy chat completions of TOKENS tokens one after the other
        (distinct prompts); appends one
        JSON line: aggregate completion tokens/s over the wall time, time
        to first token (median, p99) and inter-token latency (p50, p99)
    serve_load.py ttft URL MODEL TOKENS OUT LABELS
        time to first token of a 64-token prompt (about; the usage says
        how many) on the idle server, then again while 15 other streams
        decode; appends one JSON line with both medians and their ratio

LABELS is a JSON object merged into the line (implementation, ranks,
weights, threads). Only the standard library: it runs under any Python.
"""

import http.client
import json
import sys
import threading
import time
from urllib.parse import urlparse

TOPICS = ["a lighthouse keeper", "the history of bread", "a robot learning to paint",
          "how rivers shape valleys", "a chess tournament", "the first day of school",
          "volcanoes", "a journey by train across a desert", "bees and their hives",
          "a lost city under the sea", "how a compiler works", "the moon landing",
          "a market in the morning", "winter in the mountains", "a clockmaker's shop",
          "the life of a star"]

# About 64 tokens of text for the time-to-first-token probe.
PROBE = ("Summarize in one sentence the following notes about the harbour: the boats "
         "leave before dawn, the fish market opens at six, the gulls follow the "
         "trawlers, the ferry to the island runs twice a day, the old crane is "
         "being repaired, and the cafe by the pier serves soup to the crews.")


def stream(url, model, prompt, tokens, result):
    """One streaming request; fills `result` with its timings."""
    u = urlparse(url)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        result["error"] = f"HTTP {response.status}: {response.read()[:300]!r}"
        return
    arrivals, usage = [], None
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                arrivals.append(time.perf_counter())
                # Seen at once by `run_ttft`, which waits for the first.
                result.setdefault("first", arrivals[0] - start)
    conn.close()
    end = time.perf_counter()
    if not arrivals:
        result["error"] = "no content streamed"
        return
    result.update(start=start, end=end, first=arrivals[0] - start,
                  gaps=[b - a for a, b in zip(arrivals, arrivals[1:])],
                  tokens=usage["completion_tokens"] if usage else len(arrivals),
                  prompt_tokens=usage["prompt_tokens"] if usage else None)


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def run_clients(url, model, n, tokens):
    # One untimed request first: a server's first request may compile or
    # allocate what the others reuse (mlx_lm.server's took 8 s here).
    warm = {}
    stream(url, model, "Say hello.", 8, warm)
    results = [[{}, {}] for _ in range(n)]

    def client(i):
        for r, result in enumerate(results[i]):
            stream(url, model, f"Write a long story about {TOPICS[(i + 7 * r) % len(TOPICS)]}.",
                   tokens, result)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [r for pair in results for r in pair]
    errors = [r["error"] for r in flat if "error" in r]
    if errors:
        raise SystemExit(f"serve_load: {len(errors)} requests failed, first: {errors[0]}")
    wall = max(r["end"] for r in flat) - min(r["start"] for r in flat)
    gaps = [g for r in flat for g in r["gaps"]]
    firsts = [r["first"] for r in flat]
    total = sum(r["tokens"] for r in flat)
    return {"clients": n, "requests": len(flat), "completion_tokens": total,
            "seconds": wall, "tokens_per_s": total / wall,
            "ttft_ms_p50": quantile(firsts, 0.5) * 1e3, "ttft_ms_p99": quantile(firsts, 0.99) * 1e3,
            "itl_ms_p50": quantile(gaps, 0.5) * 1e3, "itl_ms_p99": quantile(gaps, 0.99) * 1e3}


def probe(url, model, i):
    # Each probe's own words first, so that no server finds the probe in
    # a cache an earlier one left (beyond the chat template's start).
    result = {}
    stream(url, model, f"Probe {i}. {PROBE}", 4, result)
    if "error" in result:
        raise SystemExit(f"serve_load: the probe failed: {result['error']}")
    return result


def run_ttft(url, model, tokens):
    probe(url, model, 0)  # warm-up
    idle = [probe(url, model, i) for i in range(1, 4)]
    background = [{} for _ in range(15)]
    threads = [threading.Thread(target=stream, args=(
        url, model, f"Write a long story about {TOPICS[i]}.", tokens, background[i]))
        for i in range(15)]
    for t in threads:
        t.start()
    # Probe once the 15 decode, i.e. after their first tokens; the
    # background's TOKENS are enough to outlast the three probes.
    time.sleep(0.5)
    while sum(1 for b in background if "first" in b or "error" in b) < 15 and \
            any(t.is_alive() for t in threads):
        time.sleep(0.05)
    loaded = [probe(url, model, i) for i in range(4, 7)]
    still = sum(t.is_alive() for t in threads)
    for t in threads:
        t.join()
    idle_ms = quantile([r["first"] for r in idle], 0.5) * 1e3
    loaded_ms = quantile([r["first"] for r in loaded], 0.5) * 1e3
    return {"probe_prompt_tokens": idle[0]["prompt_tokens"], "ttft_idle_ms": idle_ms,
            "ttft_loaded_ms": loaded_ms, "ttft_ratio": loaded_ms / idle_ms,
            "background_streams_left": still}


def main():
    mode, url, model = sys.argv[1:4]
    if mode == "clients":
        n, tokens, out, labels = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]
        row = run_clients(url, model, n, tokens)
    elif mode == "ttft":
        tokens, out, labels = int(sys.argv[4]), sys.argv[5], sys.argv[6]
        row = run_ttft(url, model, tokens)
    else:
        raise SystemExit(f"serve_load: unknown mode {mode!r}; expected clients or ttft")
    row = {**json.loads(labels), "kind": mode, "max_tokens": tokens, **row}
    print(json.dumps(row), flush=True)
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
