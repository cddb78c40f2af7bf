#!/bin/bash
# On the GPU host (one `run` call of the device tool, `.gpubin` carried): the group kernels of
# two builds in L2 on its Xeon, both roles, RUNS runs each in turns (.gpubin/gk-old, .gpubin/gk:
# the `group_kernels` example of each build, debug info stripped); every run in
# $OUT/NAME.txt, the fastest per scheme, role and build in $OUT/NAME-summary.txt.
#   SCHEMES="int3-g128 q4_0" NAME=l2-xeon [RUNS=5] bash bench/gpu/host-l2.sh
set -u
: "${SCHEMES:?the schemes to time, space-separated}" "${NAME:?the name of the output files}"
for i in $(seq "${RUNS:-5}"); do
  for b in gk-old gk; do
    ROLE=key INTERLEAVE=1 SPAN=1024 .gpubin/$b $SCHEMES | awk -v b=$b '{print b, "score", $1, $3}'
    INTERLEAVE=1 SPAN=1024 .gpubin/$b $SCHEMES | awk -v b=$b '{print b, "sums", $1, $5}'
  done
done > $OUT/$NAME.txt
python3 - $OUT/$NAME.txt <<'PY' | tee $OUT/$NAME-summary.txt
import collections, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    build, role, kv, ns = line.split()
    runs[(kv, role, build)].append(float(ns))
for (kv, role, build), ns in sorted(runs.items()):
    print(f"{kv:12} {role:6} {build:7} min {min(ns):.2f}  all " + " ".join(f"{x:.2f}" for x in ns))
PY
