#!/usr/bin/env bash
# Runs a kvq command that prints JSON and stores it under bench/results/NAME.json together with
# the command line, the machine and the date.
# Usage: scripts/record.sh NAME kvq SUBCOMMAND ARGS... --json
# KVQ_BIN=PATH KVQ_COMMIT=REV time another build (an A/B against an earlier commit).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
name="$1"; shift
[ "$1" = "kvq" ] && shift
bin="${KVQ_BIN:-$root/target/release/kvq}"
[ -x "$bin" ] || (cd "$root" && cargo build --release -p kvq-cli)
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
"$bin" "$@" > "$out"
mkdir -p "$root/bench/results"
python3 - "$root/bench/results/$name.json" "$out" "kvq $*" <<'PY'
import json, os, platform, subprocess, sys, datetime
dest, result, command = sys.argv[1:4]
info = {}
for line in open("/proc/cpuinfo"):
    key, _, value = line.partition(":")
    info.setdefault(key.strip(), value.strip())
# The model name alone does not tell the hosts apart ("Intel(R) Xeon(R) Processor" in a VM).
cpu = f'{info.get("model name", platform.processor())} (family {info.get("cpu family", "?")} model {info.get("model", "?")})'
mem = next((l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal")), "0")
commit = os.environ.get("KVQ_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
record = {
    "command": command,
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "machine": {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(int(mem) / 2**20, 1), "kernel": platform.release()},
    "commit": commit,
    "result": json.load(open(result)),
}
json.dump(record, open(dest, "w"), indent=2)
print(f"wrote {dest}")
PY
