"""Joins `kvq bench attention --device cuda --json` with sdpa_bench.py's JSON into one table
(best tuning per scheme and shape): writes PREFIX.json and PREFIX.md and prints the Markdown."""
import json
import sys

kvq = json.load(open(sys.argv[1]))
sdpa = {(r["batch"], r["ctx"]): r for r in json.load(open(sys.argv[2]))}
prefix = sys.argv[3]
best = {}
for r in kvq:
    key = (r["kv"], r["batch"], r["ctx"])
    if key not in best or r["ms"] < best[key]["ms"]:
        best[key] = r
rows = []
for (kv, b, ctx), r in best.items():
    s = sdpa.get((b, ctx))
    row = dict(r)
    row["tunings"] = {x["tuning"]: x["ms"] for x in kvq if (x["kv"], x["batch"], x["ctx"]) == (kv, b, ctx)}
    if s:
        row.update(sdpa_ms=s["ms"], sdpa_gb_per_s=s["gb_per_s"], speedup_vs_sdpa=s["ms"] / r["ms"],
                   sdpa_copy_gb_per_s=s["copy_gb_per_s"])
    rows.append(row)
for s in sdpa.values():
    rows.append(dict(s, pct_of_copy=100 * s["gb_per_s"] / s["copy_gb_per_s"]))
json.dump(rows, open(prefix + ".json", "w"), indent=1)
copy = kvq[0]["copy_gb_per_s"] if kvq else 0
lines = [f"Device: {kvq[0]['device'] if kvq else '?'}; device copy (read + write) {copy:.0f} GB/s measured by kvq, "
         f"{next(iter(sdpa.values()))['copy_gb_per_s']:.0f} GB/s by torch, same run. 32 query / 8 KV heads, head_dim 128, "
         "one query token per sequence; median of 20.", "",
         "| kv | batch | ctx | tuning | ms | MB read | GB/s | % copy | SDPA bf16 ms | speedup |",
         "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
for r in sorted(rows, key=lambda r: (r["kv"] != "sdpa-bf16", r["kv"], r["batch"], r["ctx"])):
    lines.append(f"| {r['kv']} | {r['batch']} | {r['ctx']} | {r.get('tuning', '-')} | {r['ms']:.4f} | "
                 f"{r['bytes_read'] / 1e6:.1f} | {r['gb_per_s']:.0f} | {r['pct_of_copy']:.1f} | "
                 f"{r.get('sdpa_ms', r['ms']):.4f} | {r.get('speedup_vs_sdpa', 1.0):.2f} |")
open(prefix + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
