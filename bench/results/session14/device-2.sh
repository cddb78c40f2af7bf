#!/bin/bash
# Session 14's second call on the GPU host: the 4-bit table cut (c6c85dd) in L2 against
# d9e350b's group kernels (.gpubin/gk-old), both roles, 5 runs each (bench/gpu/host-l2.sh);
# then the 4-bit schemes at 32K on its Xeon, 2 threads, three rounds (fastest × f16's
# fastest).
SCHEMES="turbo4 iq4_nl q4_0 int4-g128 int3-g128 turbo3" NAME=l2-xeon-4bit bash bench/gpu/host-l2.sh
for round in 1 2 3; do
  RAYON_NUM_THREADS=2 .gpubin/kvq bench attention --kv turbo4,iq4_nl,q4_0,int4-g128,int3-g128,turbo3 \
    --ctx 32768 --iters 10 --json 2>/dev/null | python3 -c "
import json,sys; d=json.load(sys.stdin)
print('f16 %.3f'%d[0]['baseline_fastest_ms'], ' '.join('%s %.3f (%.2f)'%(x['kv'],x['fastest_ms'],x['fastest_ms']/x['baseline_fastest_ms']) for x in d))"
done | tee $OUT/xeon-4bit-summary.txt
