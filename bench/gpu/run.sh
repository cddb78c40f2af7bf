#!/bin/bash
# One device call: self-test, correctness tests, CUDA attention benchmark and the PyTorch SDPA
# baseline. Expects .gpubin/ (kvq and the kvq-gpu test binary) built on the CPU machine.
# Writes at most 6 files under $OUT (log.txt, tests.txt, sdpa.json, kvq.json, gpu-attention.*).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$LOG" 2>&1
.gpubin/kvq gpu-info 2>&1 | tee -a "$LOG"
timeout 200 .gpubin/gpu-test --test-threads=1 --nocapture --skip kernels_compile > "$OUT/tests.txt" 2>&1; echo "tests rc=$?" >> "$OUT/tests.txt"
grep -E "SKIP|identical|relative|test result|panicked|rc=" "$OUT/tests.txt" | tail -80
B=${B:-1,8,32}; C=${C:-4096,32768,131072}
KV=${KV:-f16,bf16,fp8,q8_0,q4_0,int8,int4-g32,int4-g64,int4-g128,kivi4,kivi2,turbo4,turbo3.5,turbo3,turbo2.5,oaken,turbo3-prod}
python3 bench/gpu/sdpa_bench.py "$B" "$C" > "$OUT/sdpa.json" 2>> "$LOG"; echo "sdpa rc=$?"
.gpubin/kvq bench attention --device cuda --kv "$KV" --batch "$B" --ctx "$C" --iters 20 --json > "$OUT/kvq.json" 2>> "$LOG"; echo "kvq rc=$?"
tail -3 "$LOG"
python3 bench/gpu/report.py "$OUT/kvq.json" "$OUT/sdpa.json" "$OUT/gpu-attention" | grep -E "^\| (kv|q4_0|q8_0|int4-g64|turbo3|turbo3-prod|oaken|f16|kivi4|fp8) \| 32 \| 32768"
