#!/usr/bin/env python3
"""Serving throughput of `kvq serve` at 1, 8 and 32 concurrent streams for each scheme, and the
number of concurrent 4K-token sequences a fixed cache memory holds (from `kvq memory`).

Usage: bench/results/serve/bench.py KVQ_BINARY OUT.json   (standard library only; 127.0.0.1)"""
import json, platform, subprocess, sys, threading, time, urllib.request, datetime, os

KVQ, OUT = sys.argv[1], sys.argv[2]
SCHEMES = ["f16", "q4_0"]
STREAMS = [1, 8, 32]
MAX_TOKENS, PER_CLIENT, PORT = 16, 2, 18790
MEMORY = 1 << 30
MODEL = "gemma-3-270m-q4_k_m"
PROMPT = "Write a short note about the history of the city of Paris."


def stream(port, results):
    for _ in range(PER_CLIENT):
        body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                           "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"content-type": "application/json"})
        t0, first, tokens = time.time(), None, 0
        with urllib.request.urlopen(req) as r:
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                elif first is None:
                    first = time.time() - t0
        results.append((first, tokens))


def serve_runs(kv):
    cmd = [KVQ, "serve", "--kv", kv, "--port", str(PORT), "--max-batch", "32",
           "--max-seq-len", "4096", "--cache-memory", str(MEMORY)]
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    banner = server.stderr.readline().strip()
    runs = []
    try:
        for n in STREAMS:
            results = []
            threads = [threading.Thread(target=stream, args=(PORT, results)) for _ in range(n)]
            t0 = time.time()
            for t in threads: t.start()
            for t in threads: t.join()
            wall = time.time() - t0
            tokens = sum(t for _, t in results)
            runs.append({"kv": kv, "streams": n, "requests": len(results), "max_tokens": MAX_TOKENS,
                         "wall_s": round(wall, 2), "requests_per_s": round(len(results) / wall, 3),
                         "tokens_per_s": round(tokens / wall, 1),
                         "mean_ttft_s": round(sum(f for f, _ in results) / len(results), 3)})
            print(runs[-1], flush=True)
    finally:
        server.terminate()
        server.wait()
    return " ".join(cmd), banner, runs


def fit(kv):
    out = subprocess.run([KVQ, "memory", "--ctx", "4096", "--batch", "1", "--kv", kv, "--json"],
                         capture_output=True, text=True, check=True).stdout
    m = json.loads(out)
    return {"kv": kv, "bytes_per_4k_sequence": m["bytes"], "bits_per_element": m["bits_per_element"],
            "sequences_4k_in_1GiB": MEMORY // m["bytes"]}


serve = [serve_runs(kv) for kv in SCHEMES]
result = {
    "command": "bench/results/serve/bench.py " + " ".join(sys.argv[1:]),
    "serve_commands": [c for c, _, _ in serve],
    "server_banners": [b for _, b, _ in serve],
    "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.processor() or platform.platform()}",
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "model": MODEL, "prompt": PROMPT, "per_client_requests": PER_CLIENT,
    "throughput": [r for _, _, runs in serve for r in runs],
    "fit_4k_sequences": [fit(kv) for kv in ["f16", "q8_0", "q4_0", "turbo4", "int4", "turbo3", "kivi2"]],
}
json.dump(result, open(OUT, "w"), indent=1)
print(json.dumps(result["fit_4k_sequences"], indent=1))
