#!/bin/bash
# v4 call 4: ncu instruction counts, opcode mix and warp stalls of oaken and turbo3-prod at
# 32 × 32K (their best tunings in call 3), to explain their time.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for kv in oaken:16:4 turbo3-prod:16:3; do
  IFS=: read name bps mb <<< "$kv"
  echo "=== $name" >> "$OUT/ncu.txt"
  KVQ_GPU_TUNINGS=$bps:$mb timeout 150 /usr/local/cuda/bin/ncu --kernel-name attn_partial --launch-skip 2 --launch-count 1 --section WarpStateStats --metrics sass__inst_executed_per_opcode,smsp__inst_executed.sum,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,gpu__time_duration.sum --print-metric-instances details --page raw .gpubin/kvq bench attention --device cuda --kv $name --batch 32 --ctx 32768 --iters 1 >> "$OUT/ncu.txt" 2>&1; echo "ncu $name rc=$?"
done
grep -E "^===|sass__inst_executed_per_opcode|smsp__inst_executed.sum|pct_of_peak|registers_per_thread |gpu__time_duration|issue_stalled_.*per_issue_active" "$OUT/ncu.txt" | grep -vE " 0$|0\.0[0-9]?$" | cut -c1-400
