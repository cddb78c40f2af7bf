#!/bin/bash
# Final check at HEAD: the GPU tests, and the 2-4-bit schemes at 32K on the Xeon (8 and 2 threads).
LD_LIBRARY_PATH=/usr/local/cuda/lib64 .gpubin/gpu-tests --test-threads 1 > $OUT/gpu-tests.txt 2>&1; tail -3 $OUT/gpu-tests.txt
for t in 8 2; do
  echo "$t $(RAYON_NUM_THREADS=$t .gpubin/kvq-new bench attention --kv turbo4,q4_0,int4,turbo3,int3,turbo2,turbo3.5,kivi4-g128,kivi4 --ctx 32768 --iters 10 --json 2>/dev/null | tr -d '\n')" >> $OUT/xeon.txt
done
python3 - $OUT/xeon.txt <<'PY'
import json,sys
for l in open(sys.argv[1]):
    t,js=l.split(' ',1)
    d=json.loads(js)
    print(t,'f16 %.3f'%d[0]['baseline_fastest_ms'],' '.join('%s %.3f (%.2f)'%(x['kv'],x['fastest_ms'],x['fastest_ms']/x['baseline_fastest_ms']) for x in d))
PY
