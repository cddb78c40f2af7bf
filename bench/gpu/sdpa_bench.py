"""PyTorch baseline for `kvq bench attention --device cuda`: bf16 scaled_dot_product_attention,
one query token per sequence, grouped-query (enable_gqa=True), same shapes; prints JSON rows.
Also measures a 1 GiB device-to-device copy (bytes read + written per second)."""
import json
import sys

import torch
import torch.nn.functional as F


def median_ms(fn, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    batches = [int(x) for x in sys.argv[1].split(",")]
    contexts = [int(x) for x in sys.argv[2].split(",")]
    qh, kvh, d = 32, 8, 128
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * src.numel() / (median_ms(lambda: dst.copy_(src)) * 1e-3)
    del src, dst
    rows = []
    for b in batches:
        for ctx in contexts:
            q = torch.rand(b, qh, 1, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
            k = torch.rand(b, kvh, ctx, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
            v = torch.rand(b, kvh, ctx, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
            ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
            nbytes = 2 * b * kvh * ctx * d * 2
            rows.append({"kv": "sdpa-bf16", "batch": b, "ctx": ctx, "ms": ms, "bytes_read": nbytes,
                         "gb_per_s": nbytes / (ms * 1e-3) / 1e9, "copy_gb_per_s": copy / 1e9,
                         "torch": torch.__version__})
            del q, k, v
            torch.cuda.empty_cache()
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
