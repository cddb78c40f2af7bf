#!/usr/bin/env bash
# A/B of kvq builds in turns: the attention benchmark of each build, one after another, ROUNDS
# times (each round starting with the next build), so that the slow minutes of a shared
# machine hit every build alike. Prints, per build
# and cache, the fastest and the median of the rounds' fastest times (ms), all of them, and the
# median of the rounds' turn ratios (each run's median of turn time over the f16 cache's in the
# same turn: the figure that a loaded host moves least).
#
# Usage: bench/cpu/ab.sh ROUNDS NAME:BINARY[:ENV=VALUE] ...
#   KV=turbo3,q4_0 CTX=32768 ITERS=10 bench/cpu/ab.sh 4 old:/tmp/kvq-old: new:target/release/kvq:
# (ENV=VALUE sets one environment variable for that build's runs, e.g. RAYON_NUM_THREADS=1.)
set -euo pipefail
rounds=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
builds=("$@")
for round in $(seq "$rounds"); do
  # Each round starts one build later, so that no build always runs first or last.
  for i in $(seq 0 $((${#builds[@]} - 1))); do
    build=${builds[$(((i + round) % ${#builds[@]}))]}
    IFS=: read -r name bin vars <<< "$build"
    env $vars "$bin" bench attention --kv "${KV:-turbo3,q4_0}" --ctx "${CTX:-32768}" \
        --iters "${ITERS:-10}" --json 2>/dev/null |
      python3 -c "
import json, sys
records = json.load(sys.stdin)
print('$name', 'f16', records[0]['baseline_fastest_ms'], 1.0)
for r in records:
    print('$name', r['kv'], r['fastest_ms'], r['turn_ratio'])
" >> "$out"
  done
done
python3 - "$out" <<'PY'
import collections, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, kv, ms, ratio = line.split()
    runs[(name, kv)].append((float(ms), float(ratio)))
for (name, kv), rounds in sorted(runs.items()):
    ms = sorted(m for m, _ in rounds)
    ratios = sorted(r for _, r in rounds)
    print(f"{name:8} {kv:10} min {ms[0]:.3f} med {ms[len(ms) // 2]:.3f}  "
          f"turn ratio med {ratios[len(ratios) // 2]:.3f}  all "
          + " ".join(f"{m:.2f}" for m, _ in rounds))
PY
