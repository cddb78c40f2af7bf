#!/usr/bin/env bash
# Instructions per row of the group kernels, counted by valgrind's cachegrind: a figure that a
# loaded host does not move (the timings of `group_kernels` move 1.5-2x on a shared machine),
# for comparing two builds of a kernel. Counts every function of the run with at least one
# instruction per row (a kernel with its closures); the kernels are `score_tile` (ROLE=key;
# `score_unit_tile` for KIVI's key blocks) and `sum_tile` (ROLE=value).
#
# Usage: bench/cpu/icount.sh ROLE BINARY SCHEME...
#   cargo build --release -p kvq-codec --example group_kernels
#   bench/cpu/icount.sh value target/release/examples/group_kernels q4_0 int4-g128
# (The example runs 15 x 200 passes over ROWS=2048 rows of interleaved blocks, SPAN=1024.)
set -euo pipefail
role=$1 bin=$2
shift 2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rows=$((15 * 200 * 2048))
for scheme in "$@"; do
  INTERLEAVE=1 SPAN=1024 ROWS=2048 ROLE="$role" valgrind --tool=cachegrind --cache-sim=no \
    --cachegrind-out-file="$out" "$bin" "$scheme" > /dev/null 2>&1
  cg_annotate --auto=no "$out" 2>/dev/null | awk -v scheme="$scheme" -v rows="$rows" '
    /file:function/ { listed = 1; next }
    listed && /^ *[0-9,]+ \(/ {
      n = $1; gsub(",", "", n)
      # Closures of a kernel and helpers inlined into it count as the kernel.
      if ($0 ~ /score_unit_tile/) name = "score_unit_tile"
      else if ($0 ~ /score_tile/) name = "score_tile"
      else if ($0 ~ /sum_tile/) name = "sum_tile"
      else { k = split($0, parts, ":"); name = parts[k] }
      count[name] += n
    }
    END { for (f in count) if (count[f] >= rows) printf "%-12s %-24s %7.1f instructions/row\n", scheme, f, count[f] / rows }' |
    sort -k3 -rn
done
