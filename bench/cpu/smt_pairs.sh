#!/usr/bin/env bash
# Which CPUs of a VM share a physical core (a guest's `lscpu` may report one thread per core
# whatever the host does): a compute-bound kernel (int3-g128 key scores in L2, the
# group_kernels example) alone on CPU 0, then on CPU 0 beside a copy on CPU j. A sibling of
# CPU 0 slows both; another core leaves them as alone. Pin two-thread benchmarks accordingly.
#
# Usage: bench/cpu/smt_pairs.sh GROUP_KERNELS_BINARY [CPU...]   (default CPUs: 1 2 4 8 9 15)
#   cargo build --release -p kvq-codec --example group_kernels
#   bench/cpu/smt_pairs.sh target/release/examples/group_kernels 1 2
set -euo pipefail
bin=$1
shift
cpus=("$@")
[ ${#cpus[@]} -gt 0 ] || cpus=(1 2 4 8 9 15)
run() {
  taskset -c "$1" env SPAN=1024 INTERLEAVE=1 ROLE=key "$bin" int3-g128 2>&1 | tail -1 |
    grep -oE "[0-9.]+ ns" | head -1
}
echo "CPU 0 alone: $(run 0), $(run 0)"
for j in "${cpus[@]}"; do
  other=$(mktemp)
  run "$j" > "$other" &
  beside=$(run 0)
  wait
  echo "CPU 0 beside CPU $j: $beside (CPU $j: $(cat "$other"))"
  rm -f "$other"
done
