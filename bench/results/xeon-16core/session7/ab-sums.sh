#!/bin/bash
# Xeon: the sums change (06f9812) in L2 and at 32K, in turns: old = e9d0863, mid = 76e6e1f, new = HEAD.
for r in 1 2; do for b in mid new; do
  echo "$r $b values: $(INTERLEAVE=1 SPAN=1024 .gpubin/gk-$b q4_0 turbo4 turbo3 int4 | awk '{printf "%s %s  ", $1, $6}')" | tee -a $OUT/gk.txt
done; done
for r in 1 2 3; do for t in 8; do for b in old mid new; do
  echo "$r $t $b $(RAYON_NUM_THREADS=$t .gpubin/kvq-$b bench attention --kv turbo4,q4_0,turbo3 --ctx 32768 --iters 10 --json 2>/dev/null | tr -d '\n')" >> $OUT/xeon.txt
done; done; done
python3 - $OUT/xeon.txt <<'PY'
import json,sys
for l in open(sys.argv[1]):
    r,t,b,js=l.split(' ',3)
    try: d=json.loads(js)
    except Exception as e: print(r,t,b,'bad',js[:200]); continue
    print(r,t,b,'f16 %.3f'%d[0]['baseline_fastest_ms'],' '.join('%s %.3f (%.2f)'%(x['kv'],x['fastest_ms'],x['fastest_ms']/x['baseline_fastest_ms']) for x in d))
PY
