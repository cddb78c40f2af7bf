#!/usr/bin/env bash
# llama.cpp CPU baseline for comparison.
#
# Usage: bench/llama_cpp_baseline.sh [BUILD_DIR] [MODEL]
#   BUILD_DIR  llama.cpp build dir containing bin/llama-bench, bin/llama-perplexity
#              (default /tmp/llamacpp/build)
#   MODEL      GGUF model (default /work/main/models/gemma-3-270m-q4_k_m.gguf)
#
# Env overrides:
#   THREADS=2        threads for every run
#   REPS=5           llama-bench repetitions (-r)
#   DEPTH=4096       context depth for the "decode with existing context" run (0 = skip)
#   DEPTH_REPS=2     repetitions for the depth run (each one re-fills DEPTH tokens, slow on 2 cores)
#   PPL=1            run the 8-chunk wikitext-2 perplexity sanity check (0 = skip)
#   PPL_CHUNKS=8     number of 512-token chunks for perplexity
#   WIKI=/work/shared/data/wikitext-2-raw/wiki.test.raw
#
# llama.cpp itself is built outside the repo, from PyPI's source package (llama.cpp 0c1e570):
#   pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/llamacpp-src
#   tar xzf /tmp/llamacpp-src/llama_cpp_python-0.3.36.tar.gz -C /tmp/llamacpp
#   ln -s /tmp/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp /tmp/llamacpp/src
#   apt-get install -y cmake
#   cmake -S /tmp/llamacpp/src -B /tmp/llamacpp/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
#     -DGGML_OPENMP=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
#     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMIT=0c1e570
#   cmake --build /tmp/llamacpp/build -j2 --target llama-bench llama-perplexity   (about 8 minutes)
# Nothing here writes anything except to stdout/stderr.
set -euo pipefail

BUILD_DIR="${1:-/tmp/llamacpp/build}"
MODEL="${2:-/work/main/models/gemma-3-270m-q4_k_m.gguf}"
THREADS="${THREADS:-2}"
REPS="${REPS:-5}"
DEPTH="${DEPTH:-4096}"
DEPTH_REPS="${DEPTH_REPS:-2}"
PPL="${PPL:-1}"
PPL_CHUNKS="${PPL_CHUNKS:-8}"
WIKI="${WIKI:-/work/shared/data/wikitext-2-raw/wiki.test.raw}"

BENCH="$BUILD_DIR/bin/llama-bench"
PERP="$BUILD_DIR/bin/llama-perplexity"
for f in "$BENCH" "$MODEL"; do
    [[ -e "$f" ]] || { echo "missing: $f" >&2; exit 1; }
done

echo "### llama.cpp version"
"$BENCH" --version 2>&1 | tail -n 2

# Summarise llama-bench JSON (array of test records) as one line per test.
summarise() {
    python3 -c '
import json, sys
for r in json.load(sys.stdin):
    p, g, d = r["n_prompt"], r["n_gen"], r.get("n_depth", 0)
    name = ("pp%d" % p if p else "") + ("tg%d" % g if g else "")
    if d: name += " @ d%d" % d
    print("%-16s %10.2f +- %6.2f tok/s  (threads=%s, reps=%d)" % (
        name, r["avg_ts"], r["stddev_ts"], r["n_threads"], len(r["samples_ts"])))
'
}

echo
echo "### llama-bench -p 512 -n 128 (depth 0)"
J0=$("$BENCH" -m "$MODEL" -t "$THREADS" -r "$REPS" -p 512 -n 128 -o json)
echo "$J0"

JD=""
# (capture --help first: piping into grep -q under pipefail gives SIGPIPE -> false)
HELP=$("$BENCH" --help 2>&1 || true)
if [[ "$DEPTH" != "0" ]] && grep -q -- '--n-depth' <<<"$HELP"; then
    echo
    echo "### llama-bench -p 0 -n 128 -d $DEPTH (decode with $DEPTH tokens already in the KV cache)"
    JD=$("$BENCH" -m "$MODEL" -t "$THREADS" -r "$DEPTH_REPS" -p 0 -n 128 -d "$DEPTH" -o json)
    echo "$JD"
fi

echo
echo "### llama-bench summary"
echo "$J0" | summarise
if [[ -n "$JD" ]]; then echo "$JD" | summarise; fi

if [[ "$PPL" != "0" ]]; then
    [[ -e "$PERP" ]] || { echo "missing: $PERP" >&2; exit 1; }
    [[ -e "$WIKI" ]] || { echo "missing: $WIKI" >&2; exit 1; }
    echo
    echo "### llama-perplexity -c 512 --chunks $PPL_CHUNKS (sanity check only)"
    LOG=$(mktemp)
    "$PERP" -m "$MODEL" -f "$WIKI" -c 512 --chunks "$PPL_CHUNKS" -t "$THREADS" >"$LOG" 2>&1 || {
        tail -n 30 "$LOG" >&2; rm -f "$LOG"; exit 1; }
    grep -E '^\[[0-9]' "$LOG" || true
    grep -E 'seconds per pass|Final estimate' "$LOG" || true
    rm -f "$LOG"
fi
