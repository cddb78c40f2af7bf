#!/usr/bin/env bash
# The attention benchmark at several thread counts on one host: for each count N, the first
# N CPUs pinned (`taskset -c 0-(N-1)`, RAYON_NUM_THREADS=N), ROUNDS runs of every scheme
# against the f16 cache in turns. Shows whether the compressed caches' ratios against f16
# hold, shrink or grow as more cores share the cache's reads.
#
# Usage: THREADS="2 4 8 16" ROUNDS=2 SCHEMES="int3-g128,q4_0" CTX=32768 bench/cpu/threads.sh
# (KVQ names the binary, by default target/release/kvq.)
set -euo pipefail
kvq=${KVQ:-target/release/kvq}
lscpu | grep -E 'Model name|^CPU\(s\)|L2|L3' || true
for threads in ${THREADS:-2 4 8 16}; do
  for round in $(seq "${ROUNDS:-2}"); do
    echo "# threads $threads (CPUs 0-$((threads - 1))), round $round"
    RAYON_NUM_THREADS=$threads taskset -c "0-$((threads - 1))" \
      "$kvq" bench attention --kv "${SCHEMES:-int3-g128,turbo3,int4-g128,q4_0}" \
      --ctx "${CTX:-32768}" --iters "${ITERS:-10}"
  done
done
