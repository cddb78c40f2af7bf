#!/bin/bash
# On the GPU host (one `run` call of the device tool, `.gpubin` carried): the kvq-gpu tests,
# then decode attention at 32K on the host's Xeon, ROUNDS rounds at each thread count of
# THREADS, for the caches in KV; a summary of fastest times and their ratio to the f16
# cache's fastest of the same run in $OUT/xeon-summary.txt.
#   KV=q4_0,int3-g128 [THREADS="2 8"] [ROUNDS=3] bash bench/gpu/host-cpu.sh
# (.gpubin/kvq: the release binary; .gpubin/gpu-tests: target/release/deps/gpu-*, both with
# their debug info stripped.)
set -u
: "${KV:?the caches to time, comma-separated}"
LD_LIBRARY_PATH=/usr/local/cuda/lib64 .gpubin/gpu-tests --test-threads 1 > $OUT/gpu-tests.txt 2>&1; tail -3 $OUT/gpu-tests.txt
lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/xeon.txt
for round in $(seq "${ROUNDS:-3}"); do
  for t in ${THREADS:-2 8}; do
    echo "$t $(RAYON_NUM_THREADS=$t .gpubin/kvq bench attention --kv "$KV" --ctx 32768 --iters 10 --json 2>/dev/null | tr -d '\n')" >> $OUT/xeon.txt
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
