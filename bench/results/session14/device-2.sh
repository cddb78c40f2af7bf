#!/bin/bash
# Session 14's second call on the GPU host: the 4-bit table cut (c6c85dd) in L2 against
# d9e350b's group kernels (.gpubin/gk-old), both roles, 5 runs each; then the 4-bit schemes at
# 32K on its Xeon, 2 threads, three rounds (fastest × f16's fastest).
schemes="turbo4 iq4_nl q4_0 int4-g128 int3-g128 turbo3"
for i in 1 2 3 4 5; do
  for b in gk-old gk; do
    ROLE=key INTERLEAVE=1 SPAN=1024 .gpubin/$b $schemes | awk -v b=$b '{print b, "score", $1, $3}'
    INTERLEAVE=1 SPAN=1024 .gpubin/$b $schemes | awk -v b=$b '{print b, "sums", $1, $5}'
  done
done > $OUT/l2-xeon-4bit.txt
python3 - $OUT/l2-xeon-4bit.txt <<'PY' | tee $OUT/l2-xeon-4bit-summary.txt
import collections, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    build, role, kv, ns = line.split()
    runs[(kv, role, build)].append(float(ns))
for (kv, role, build), ns in sorted(runs.items()):
    print(f"{kv:12} {role:6} {build:7} min {min(ns):.2f}  all " + " ".join(f"{x:.2f}" for x in ns))
PY
for round in 1 2 3; do
  RAYON_NUM_THREADS=2 .gpubin/kvq bench attention --kv turbo4,iq4_nl,q4_0,int4-g128,int3-g128,turbo3 \
    --ctx 32768 --iters 10 --json 2>/dev/null | python3 -c "
import json,sys; d=json.load(sys.stdin)
print('f16 %.3f'%d[0]['baseline_fastest_ms'], ' '.join('%s %.3f (%.2f)'%(x['kv'],x['fastest_ms'],x['fastest_ms']/x['baseline_fastest_ms']) for x in d))"
done | tee $OUT/xeon-4bit-summary.txt
