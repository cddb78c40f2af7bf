#!/usr/bin/env bash
# Where a compressed cache's decode attention time goes on this host: each scheme's group
# kernels on rows in L2 (one thread: the arithmetic alone), and the attention benchmark with
# both, only the keys or only the values compressed (the other f16), as turn ratios against
# the f16 cache in the same run. Keys-only + values-only − 1 ≈ both, if the two phases add.
#
# Usage: CPUS=2,3 SCHEMES="int3-g128 turbo3" CTX=32768 bench/cpu/split.sh
# (KVQ and KERNELS name the binaries, by default target/release/kvq and the `group_kernels`
# example beside it; the first of CPUS times the kernels, all of them the attention.)
set -euo pipefail
kvq=${KVQ:-target/release/kvq}
kernels=${KERNELS:-target/release/examples/group_kernels}
cpus=${CPUS:-0,1}
schemes=${SCHEMES:-int3-g128 turbo3 int4-g128 q4_0}
lscpu | grep -E 'Model name|^CPU\(s\)|L1d|L2|L3|max MHz' || true
for s in $schemes; do
  for role in key value; do
    printf '%-6s ' "$role"
    SPAN=1024 INTERLEAVE=1 ROLE=$role taskset -c "${cpus%%,*}" "$kernels" "$s"
  done
done
kv=$(for s in $schemes; do printf '%s,k=%s;v=f16,k=f16;v=%s,' "$s" "$s" "$s"; done)
RAYON_NUM_THREADS=$(($(tr -cd , <<< "$cpus" | wc -c) + 1)) taskset -c "$cpus" \
  "$kvq" bench attention --kv "${kv%,}" --ctx "${CTX:-32768}" --iters "${ITERS:-10}"
