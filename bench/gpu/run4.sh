#!/bin/bash
# v4 call: correctness tests (21 schemes, with oaken and turbo*-prod), SDPA, the full benchmark
# (with oaken and turbo3-prod) over 4 tunings with the v4 binary (.gpubin/kvq), the same subset
# with the v3 kernels (.gpubin/kvq-v3: same tree without the v4 change) for an A/B in one call,
# and ncu warp-stall reasons of q4_0 at 32 × 32K for both.
export KVQ_GPU_TUNINGS=${KVQ_GPU_TUNINGS:-8:3,16:3,8:4,16:4}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bash bench/gpu/run.sh
SUB="--kv f16,q8_0,q4_0,int4-g64,kivi4,turbo3,oaken,turbo3-prod --batch 8,32 --ctx 32768,131072 --iters 20 --json"
for v in kvq-v3 kvq; do
  .gpubin/$v bench attention --device cuda $SUB > "$OUT/ab-$v.json" 2>> "$OUT/log.txt"; echo "$v rc=$?"
done
python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
a = {(r["kv"], r["batch"], r["ctx"], r["tuning"]): r["ms"] for r in json.load(open(o + "/ab-kvq-v3.json"))}
b = {(r["kv"], r["batch"], r["ctx"], r["tuning"]): r["ms"] for r in json.load(open(o + "/ab-kvq.json"))}
best = {}
for k in a:
    s = k[:3]
    best.setdefault(s, [9e9, 9e9])
    best[s][0] = min(best[s][0], a[k]); best[s][1] = min(best[s][1], b.get(k, 9e9))
print("A/B best-of-4-tunings ms: kv batch ctx | v3 | v4 | v3/v4")
for s, (x, y) in sorted(best.items()):
    print(*s, f"| {x:.4f} | {y:.4f} | {x / y:.3f}")
PY
NCU=/usr/local/cuda/bin/ncu
for v in kvq-v3 kvq; do
  echo "=== $v" >> "$OUT/ncu.txt"
  KVQ_GPU_TUNINGS=8:4 timeout 120 $NCU --kernel-name attn_partial --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section InstructionStats --page raw .gpubin/$v bench attention --device cuda --kv q4_0 --batch 32 --ctx 32768 --iters 1 >> "$OUT/ncu.txt" 2>&1; echo "ncu $v rc=$?"
done
grep -E "^===|gpu__time_duration.sum|issue_stalled_.*per_issue_active|smsp__inst_executed.sum |smsp__average_warp_latency_per_inst_issued|sm__warps_active.avg.pct|launch__registers" "$OUT/ncu.txt" | grep -vE " 0$|0\.0[0-9]?$" | head -80
