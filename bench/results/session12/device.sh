#!/bin/bash
# Session 12 on the GPU host: the kvq-gpu tests, then the 2- to 4-bit schemes at 32K on its
# Xeon at 2 and 8 threads, three rounds, with session 12's kernels (b7ee5c6).
# (.gpubin/gpu-tests: the kvq-gpu integration tests, target/release/deps/gpu-*.)
LD_LIBRARY_PATH=/usr/local/cuda/lib64 .gpubin/gpu-tests --test-threads 1 > $OUT/gpu-tests.txt 2>&1; tail -3 $OUT/gpu-tests.txt
lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/xeon.txt
for round in 1 2 3; do
  for t in 2 8; do
    echo "$t $(RAYON_NUM_THREADS=$t .gpubin/kvq bench attention --kv q4_0,q4_1,iq4_nl,int4-g64,int4-g128,int3-g64,kivi4-g128,kivi4,turbo4,turbo4-prod,int3-g128,turbo3,turbo3-prod,int2-g128,turbo2 --ctx 32768 --iters 10 --json 2>/dev/null | tr -d '\n')" >> $OUT/xeon.txt
  done
done
python3 - $OUT/xeon.txt <<'PY' | tee $OUT/xeon-summary.txt
import json,sys
for l in open(sys.argv[1]):
    if not l[0].isdigit(): print(l.strip()); continue
    t,js=l.split(' ',1)
    d=json.loads(js)
    print(t,'f16 %.3f'%d[0]['baseline_fastest_ms'],' '.join('%s %.3f (%.2f)'%(x['kv'],x['fastest_ms'],x['fastest_ms']/x['baseline_fastest_ms']) for x in d))
PY
