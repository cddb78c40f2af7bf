#!/bin/bash
# v3 run 1: correctness tests, a timing subset over 4 tunings, one ncu profile if ncu exists.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/smi.txt" 2>&1
timeout 150 .gpubin/gpu-test --test-threads=1 --nocapture --skip kernels_compile > "$OUT/tests.txt" 2>&1; echo "tests rc=$?" >> "$OUT/tests.txt"
grep -E "SKIP|identical|relative|test result|panicked|rc=" "$OUT/tests.txt" | tail -70
KVQ_GPU_TUNINGS=8:3,16:3,8:4,16:4 timeout 200 .gpubin/kvq bench attention --device cuda --kv f16,q8_0,q4_0,int4-g64,kivi4,turbo3,turbo4,fp8,turbo3.5 --batch 8,32 --ctx 32768,131072 --iters 10 > "$OUT/sub.txt" 2> "$OUT/sub.err"; echo "sub rc=$?"
cat "$OUT/sub.txt"; tail -3 "$OUT/sub.err"
NCU=$(which ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null); echo "ncu: $NCU"
if [ -n "$NCU" ]; then
  KVQ_GPU_TUNINGS=8:3 timeout 120 $NCU --kernel-name attn_partial --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats .gpubin/kvq bench attention --device cuda --kv q4_0 --batch 32 --ctx 32768 --iters 1 > "$OUT/ncu.txt" 2>&1; echo "ncu rc=$?"
  grep -vE "^==PROF==|^ *$" "$OUT/ncu.txt" | tail -80
fi
