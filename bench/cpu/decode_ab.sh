#!/usr/bin/env bash
# A/B of kvq builds on whole-model decode, in turns whose order rotates each round (as ab.sh
# does for attention): `kvq bench decode` of every build, ROUNDS times. Prints per build the
# median tokens/s, every round's figure, and the median of the rounds' ratios to the first
# build (the figure a loaded host moves least).
#
# Usage: bench/cpu/decode_ab.sh ROUNDS BINARY[:KV]...   (KV: that run's cache, default $KV)
#   CTX=512 KV=f16 TOKENS=48 bench/cpu/decode_ab.sh 6 /tmp/kvq-old target/release/kvq
#   CTX=16384 bench/cpu/decode_ab.sh 6 target/release/kvq:f16 target/release/kvq:int4-g128
set -euo pipefail
rounds=$1
shift
builds=("$@")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for round in $(seq "$rounds"); do
  for i in $(seq 0 $((${#builds[@]} - 1))); do
    b=$(((i + round) % ${#builds[@]}))
    IFS=: read -r bin kv <<< "${builds[$b]}"
    "$bin" bench decode --ctx "${CTX:-512}" --tokens "${TOKENS:-48}" --prefill 0 \
        --kv "${kv:-${KV:-f16}}" --json 2>/dev/null |
      python3 -c "import json, sys; print($round, $b, json.load(sys.stdin)[0]['tokens_per_s'])" >> "$out"
  done
done
python3 - "$out" "${builds[@]}" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
tps = {(int(r), int(b)): float(t) for r, b, t in rows}
rounds = sorted({r for r, _ in tps})
for b, name in enumerate(sys.argv[2:]):
    runs = [tps[(r, b)] for r in rounds]
    ratio = statistics.median(tps[(r, b)] / tps[(r, 0)] for r in rounds)
    print(f"{name:32s} median {statistics.median(runs):7.2f} tok/s  ratio to first {ratio:.3f}  "
          f"rounds {[round(t, 1) for t in runs]}")
PY
