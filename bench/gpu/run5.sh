#!/bin/bash
# v4 call 2: correctness tests (21 schemes), SDPA and the full benchmark with oaken and
# turbo3-prod (bench/gpu/run.sh, 4 tunings), then the SASS opcode mix of q4_0 at 32 × 32K.
export KVQ_GPU_TUNINGS=${KVQ_GPU_TUNINGS:-8:3,16:3,8:4,16:4}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bash bench/gpu/run.sh
KVQ_GPU_TUNINGS=8:4 timeout 100 /usr/local/cuda/bin/ncu --kernel-name attn_partial --launch-skip 2 --launch-count 1 --metrics sass__inst_executed_per_opcode,smsp__inst_executed.sum,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.avg.pct_of_peak_sustained_elapsed --print-metric-instances details .gpubin/kvq bench attention --device cuda --kv q4_0 --batch 32 --ctx 32768 --iters 1 > "$OUT/ncu.txt" 2>&1; echo "ncu rc=$?"
grep -E "sass__inst_executed_per_opcode|smsp__inst_executed.sum|pct_of_peak" "$OUT/ncu.txt" | cut -c1-1500
