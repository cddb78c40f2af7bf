#!/bin/bash
# v3 run 2: the full call (tests, SDPA, benchmark over 4 tunings, report) plus one ncu profile.
export KVQ_GPU_TUNINGS=${KVQ_GPU_TUNINGS:-8:3,16:3,8:4,16:4}
bash bench/gpu/run.sh
OUT=${OUT:-/tmp/out}
NCU=/usr/local/cuda/bin/ncu
KVQ_GPU_TUNINGS=8:4 timeout 90 $NCU --kernel-name attn_partial --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats .gpubin/kvq bench attention --device cuda --kv q4_0 --batch 32 --ctx 32768 --iters 1 > "$OUT/ncu.txt" 2>&1; echo "ncu rc=$?"
grep -E "Duration|Throughput|Registers|Active Warps|Cycles Per Issued|Dynamic Shared" "$OUT/ncu.txt"
