#!/bin/bash
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
nproc; grep -m1 "model name" /proc/cpuinfo; grep -m1 -o "avx512_vnni\|amx_int8" /proc/cpuinfo | sort -u
( .gpubin/gpu-tests --test-threads=1 2>&1 | tail -8 ) > $OUT/gpu-tests.txt
for r in 1 2; do for t in 16 8 2; do for b in old new; do
  echo "$r $t $b $(RAYON_NUM_THREADS=$t .gpubin/kvq-$b bench attention --kv turbo4,q4_0,int4,turbo3,int3,turbo2 --ctx 32768 --iters 10 --json 2>/dev/null | tr -d '\n')" >> $OUT/xeon.txt
  tail -c 300 $OUT/xeon.txt | head -c 0
done; done; done
cat $OUT/gpu-tests.txt
python3 - $OUT/xeon.txt <<'PY'
import json,sys
for l in open(sys.argv[1]):
    r,t,b,js=l.split(' ',3)
    try: d=json.loads(js)
    except Exception as e: print(r,t,b,'bad',js[:200]); continue
    print(r,t,b,'f16 %.3f'%d[0]['baseline_fastest_ms'],' '.join('%s %.3f'%(x['kv'],x['fastest_ms']) for x in d))
PY
