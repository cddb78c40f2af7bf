#!/bin/bash
# Session 8 on the GPU host: the kvq-gpu tests (TurboQuant-prod's QJL weight is now stored as
# n·γ on both sides), then the new integer paths at 32K on its Xeon (8 and 2 threads).
LD_LIBRARY_PATH=/usr/local/cuda/lib64 .gpubin/gpu-tests --test-threads 1 > $OUT/gpu-tests.txt 2>&1; tail -3 $OUT/gpu-tests.txt
grep -i "prod" $OUT/gpu-tests.txt | head -8
lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/xeon.txt
for t in 8 2; do
  echo "$t $(RAYON_NUM_THREADS=$t .gpubin/kvq-new bench attention --kv q4_0,iq4_nl,q4_1,turbo4,turbo4-prod,int4-g128 --ctx 32768 --iters 10 --json 2>/dev/null | tr -d '\n')" >> $OUT/xeon.txt
done
python3 - $OUT/xeon.txt <<'PY'
import json,sys
for l in open(sys.argv[1]):
    if not l[0].isdigit(): print(l.strip()); continue
    t,js=l.split(' ',1)
    d=json.loads(js)
    print(t,'f16 %.3f'%d[0]['baseline_fastest_ms'],' '.join('%s %.3f (%.2f)'%(x['kv'],x['fastest_ms'],x['fastest_ms']/x['baseline_fastest_ms']) for x in d))
PY
