#!/usr/bin/env bash
# The CPU measurements behind the README and the issue notes, in one run on a quiet machine.
# Every result lands in bench/results/ with its command, the machine and the date.
#   bench/cpu-suite.sh [all|speed|ppl|attention|codecs]
# llama.cpp (built outside the repo from PyPI's llama-cpp-python sdist, see bench/llama_cpp_baseline.sh)
# is timed in the same run when LLAMA_CPP_BUILD (default /tmp/llamacpp/build) holds llama-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
wiki=../shared/data/wikitext-2-raw/wiki.test.raw
cargo build --release -p kvq-cli
rec() { scripts/record.sh "$@"; }

if [[ $what == all || $what == ppl ]]; then
  rec ppl-f16-ctx512-64chunks kvq ppl --text "$wiki" --ctx 512 --chunks 64 --kv f16 --json
fi

if [[ $what == all || $what == speed ]]; then
  rec decode-f16 kvq bench decode --ctx 512,4096 --tokens 64 --prefill 512 --kv f16 --json
  rec prefill-f16-4096 kvq bench decode --ctx 4096 --tokens 8 --prefill 4096 --kv f16 --json
  for kv in f16 q4_0 int4 turbo4 q8_0; do
    rec "decode-16k-$kv" kvq bench decode --ctx 4096,16384 --tokens 32 --prefill 0 --kv "$kv" --json
  done
  llama="${LLAMA_CPP_BUILD:-/tmp/llamacpp/build}/bin/llama-bench"
  if [[ -x $llama ]]; then
    out=$(mktemp)
    "$llama" -m models/gemma-3-270m-q4_k_m.gguf -t 2 -r 3 -p 512 -n 64 -o json > "$out"
    python3 - "$out" bench/results/llama-cpp-bench.json "$llama -m models/gemma-3-270m-q4_k_m.gguf -t 2 -r 3 -p 512 -n 64 -o json" <<'PY'
import json, sys, datetime, os, platform
src, dest, cmd = sys.argv[1:4]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
json.dump({"command": cmd, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release()},
           "llama_cpp": "0c1e570 (llama-cpp-python 0.3.36 sdist)", "result": json.load(open(src))},
          open(dest, "w"), indent=2)
print("wrote", dest)
PY
  fi
fi

if [[ $what == all || $what == attention ]]; then
  # The same kernels on a 2K cache that stays in the CPU caches: their arithmetic alone.
  rec attention-2k kvq bench attention --kv f16,q8_0,q4_0,int4,int3,turbo4,turbo3 --ctx 2048 --q-heads 32 --kv-heads 8 --head-dim 128 --iters 31 --json
  # One thread: the time per token and KV head, for the 32K floor.
  RAYON_NUM_THREADS=1 rec attention-2k-1thread kvq bench attention --kv q4_0,int4,int3,turbo4,turbo3 --ctx 2048 --q-heads 32 --kv-heads 8 --head-dim 128 --iters 31 --json
  rec attention-32k kvq bench attention --kv f16,bf16,q8_0,q4_0,q4_1,iq4_nl,q5_0,q5_1,int8,int4,int4-g128,int3,int3-g128,int2,int2-g128,kivi4,kivi4-g128,kivi2,fp8,fp8-e5m2,turbo4,turbo3.5,turbo3,turbo2.5,turbo2,turbo4-prod,turbo3-prod,turbo2-prod,oaken --ctx 32768 --q-heads 32 --kv-heads 8 --head-dim 128 --iters 30 --json
  # The 2-4-bit schemes of the integer kernels alone (shorter turns), then on the f32 kernels.
  rec attention-32k-int8 kvq bench attention --kv q4_0,iq4_nl,int4,int4-g128,int3,int3-g128,int2,int2-g128,turbo4,turbo3,turbo2,kivi4-g128,kivi4,oaken --ctx 32768 --q-heads 32 --kv-heads 8 --head-dim 128 --iters 30 --json
  rec attention-32k-f32 kvq bench attention --kv q4_0,int4,int3,turbo4,turbo3 --f32-attention --ctx 32768 --q-heads 32 --kv-heads 8 --head-dim 128 --iters 15 --json
fi

if [[ $what == all || $what == codecs ]]; then
  cargo bench -p kvq-codec --bench codecs -- --output-format bencher 2>/dev/null | grep '^test ' > bench/results/codecs-criterion.txt
  python3 - <<'PY'
import json, re, datetime, os
rows = []
for line in open("bench/results/codecs-criterion.txt"):
    m = re.match(r"test (\S+) +\.\.\. bench: +([\d,]+) ns/iter", line)
    if m:
        rows.append({"bench": m.group(1), "ns_per_iter": int(m.group(2).replace(",", ""))})
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
json.dump({"command": "cargo bench -p kvq-codec --bench codecs -- --output-format bencher",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": {"cpu": cpu, "cores": os.cpu_count()}, "elements_per_iter": "4096 tokens x 128 head_dim",
           "result": rows}, open("bench/results/codecs-criterion.json", "w"), indent=2)
PY
fi
