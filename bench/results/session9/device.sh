#!/bin/bash
# Session 9 on the GPU host: the kvq-gpu tests (they compare against the CPU attention, whose
# softmax step is now one pass), then the 2–4-bit schemes and Oaken at 32K on its Xeon, at 8
# and 2 threads, three rounds.
LD_LIBRARY_PATH=/usr/local/cuda/lib64 .gpubin/gpu-tests --test-threads 1 > $OUT/gpu-tests.txt 2>&1; tail -3 $OUT/gpu-tests.txt
lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/xeon.txt
for round in 1 2 3; do
  for t in 8 2; do
    echo "$t $(RAYON_NUM_THREADS=$t .gpubin/kvq bench attention --kv q4_0,int4-g128,int3-g128,turbo4,turbo3,turbo2,kivi4-g128,oaken --ctx 32768 --iters 10 --json 2>/dev/null | tr -d '\n')" >> $OUT/xeon.txt
  done
done
python3 - $OUT/xeon.txt <<'PY'
import json,sys
for l in open(sys.argv[1]):
    if not l[0].isdigit(): print(l.strip()); continue
    t,js=l.split(' ',1)
    d=json.loads(js)
    print(t,'f16 %.3f'%d[0]['baseline_fastest_ms'],' '.join('%s %.3f (%.2f)'%(x['kv'],x['fastest_ms'],x['fastest_ms']/x['baseline_fastest_ms']) for x in d))
PY
