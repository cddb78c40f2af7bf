// kvq-gpu kernels, compiled at run time by NVRTC. Header-free: f16/bf16/fp8 conversions are
// inline PTX. The Rust side prepends a prelude that defines HD (head_dim), GQ (query heads per KV
// head), PT (tokens per page), CPL (channels per lane), UNROLL, and the structs KS and VS that
// describe the key and value layouts (see scheme.rs).

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define INFINITY __int_as_float(0x7f800000)
#define KIND_F16 0
#define KIND_BF16 1
#define KIND_Q8_0 2
#define KIND_Q4_0 3
#define KIND_UNI_TOKEN 4
#define KIND_UNI_CHANNEL 5
#define KIND_TURBO 6
#define KIND_FP8 7

__device__ __forceinline__ float h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u16 f2h(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ u16 d2h(double d) { u16 h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h; }
__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ u16 f2bf(float f) { u16 h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }
__device__ __forceinline__ float e4m3x2_lo_hi(u16 pair, float* hi) {
  u32 h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(pair));
  *hi = h2f((u16)(h2 >> 16));
  return h2f((u16)(h2 & 0xFFFF));
}
__device__ __forceinline__ u8 f2e4m3(float x) {
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
  return (u8)(r & 0xFF);
}

// f16 directed roundings of a double: smallest f16 >= x, largest f16 <= x (as in uniform.rs).
__device__ u16 f16_at_least(double x) {
  u16 n = d2h(x);
  if ((double)h2f(n) >= x) return n;
  if (n == 0x8000) return 0x0001;
  return (n & 0x8000) ? (u16)(n - 1) : (u16)(n + 1);
}
__device__ u16 f16_at_most(double x) { return f16_at_least(-x) ^ 0x8000; }

// Little-endian bytes [p, p + n) (n <= 8) as one word, read with 2-byte loads when p is even.
template <int N>
__device__ __forceinline__ u64 load_bytes(const u8* p) {
  u64 w = 0;
  if ((((u64)p) & 1) == 0 && (N % 2) == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; i++) w |= (u64)ld16(p + 2 * i) << (16 * i);
  } else {
#pragma unroll
    for (int i = 0; i < N; i++) w |= (u64)p[i] << (8 * i);
  }
  return w;
}

// Decodes channels c0 .. c0+7 of token t (within the page) of one head's run of blocks.
// Turbo rows decode to rotated coordinates (the query is rotated to match).
template <class S>
__device__ __forceinline__ void load8(const u8* run, int t, int c0, float* o) {
  if constexpr (S::KIND == KIND_F16 || S::KIND == KIND_BF16) {
    uint4 w = *(const uint4*)(run + (u64)t * S::BB + 2 * c0);
    u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      u16 lo = (u16)(ws[i] & 0xFFFF), hi = (u16)(ws[i] >> 16);
      o[2 * i] = S::KIND == KIND_F16 ? h2f(lo) : bf2f(lo);
      o[2 * i + 1] = S::KIND == KIND_F16 ? h2f(hi) : bf2f(hi);
    }
  } else if constexpr (S::KIND == KIND_FP8) {
    const u8* row = run + (u64)t * S::BB;
    float scale = h2f(ld16(row));
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float hi;
      float lo = e4m3x2_lo_hi(ld16(row + 2 + c0 + 2 * i), &hi);
      o[2 * i] = scale * lo;
      o[2 * i + 1] = scale * hi;
    }
  } else if constexpr (S::KIND == KIND_Q8_0) {
    const u8* blk = run + (u64)t * S::BB + (c0 / 32) * 34;
    float d = h2f(ld16(blk));
    u64 w = load_bytes<8>(blk + 2 + (c0 % 32));
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = d * (float)(signed char)((w >> (8 * i)) & 0xFF);
  } else if constexpr (S::KIND == KIND_Q4_0) {
    const u8* blk = run + (u64)t * S::BB + (c0 / 32) * 18;
    float d = h2f(ld16(blk));
    int j = c0 % 32;
    u64 w = load_bytes<8>(blk + 2 + (j % 16));
    int shift = j < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = d * (float)((int)((w >> (8 * i + shift)) & 0xF) - 8);
  } else if constexpr (S::KIND == KIND_UNI_TOKEN) {
    const int P = S::SYM ? 2 : 4;
    const u8* row = run + (u64)t * S::BB;
    const u8* par = row + (c0 / S::GROUP) * P;
    float scale = h2f(ld16(par));
    float offset = S::SYM ? -(float)(1 << (S::BITS - 1)) * scale : h2f(ld16(par + 2));
    u64 w = load_bytes<S::BITS>(row + (HD / S::GROUP) * P + c0 * S::BITS / 8);
#pragma unroll
    for (int i = 0; i < 8; i++)
      o[i] = scale * (float)((w >> (S::BITS * i)) & ((1u << S::BITS) - 1)) + offset;
  } else if constexpr (S::KIND == KIND_UNI_CHANNEL) {
    const int P = S::SYM ? 2 : 4;
    const u8* blk = run + (u64)(t / S::BT) * S::BB;
    u64 w = load_bytes<S::BITS>(blk + HD * P + (t % S::BT) * (HD * S::BITS / 8) + c0 * S::BITS / 8);
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const u8* par = blk + (c0 + i) * P;
      float scale = h2f(ld16(par));
      float offset = S::SYM ? -(float)(1 << (S::BITS - 1)) * scale : h2f(ld16(par + 2));
      o[i] = scale * (float)((w >> (S::BITS * i)) & ((1u << S::BITS) - 1)) + offset;
    }
  } else if constexpr (S::KIND == KIND_TURBO) {
    const u8* row = run + (u64)t * S::BB;
    float norm = h2f(ld16(row));
    if (c0 < S::SEG0) {
      u64 w = load_bytes<S::B0>(row + 2 + c0 * S::B0 / 8);
#pragma unroll
      for (int i = 0; i < 8; i++) o[i] = norm * S::lut0((int)((w >> (S::B0 * i)) & ((1u << S::B0) - 1)));
    } else {
      u64 w = load_bytes<S::B1>(row + 2 + S::SEG0 * S::B0 / 8 + (c0 - S::SEG0) * S::B1 / 8);
#pragma unroll
      for (int i = 0; i < 8; i++) o[i] = norm * S::lut1((int)((w >> (S::B1 * i)) & ((1u << S::B1) - 1)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Encode-on-write. One CUDA block (HD threads, thread = channel) encodes one codec block of one
// head: rows are [batch][n_tok][n_kv][HD] f32 (token-major, as KvCache::append takes them);
// grid = (n_tok / BT, n_kv, batch); tokens first_pos .. first_pos + n_tok of each sequence go to
// the pages its block table names.

__device__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ float warp_min(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduces over groups of G consecutive threads (G a multiple of 32 or <= 32) with shared scratch.
template <int G, bool MAX>
__device__ float group_reduce(float v, float* scratch) {
  v = MAX ? warp_max(v) : warp_min(v);
  if (G <= 32) return v;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  int first = (threadIdx.x / G) * (G / 32);
  float r = scratch[first];
  for (int i = 1; i < G / 32; i++) r = MAX ? fmaxf(r, scratch[first + i]) : fminf(r, scratch[first + i]);
  return r;
}

// Packs the codes in `codes` (BT*HD of them, `bits` wide, LSB first) into bytes at `dst`.
__device__ void pack_codes(const u8* codes, int count, int bits, u8* dst) {
  int nbytes = count * bits / 8;
  for (int b = threadIdx.x; b < nbytes; b += blockDim.x) {
    u32 v = 0;
    for (int k = 0; k < 8; k++) {
      int bit = 8 * b + k;
      int code = codes[bit / bits];
      v |= ((code >> (bit % bits)) & 1u) << k;
    }
    dst[b] = (u8)v;
  }
}

template <class S>
__device__ void encode_block(const float* rows, u8* out, const float* rot) {
  __shared__ u8 codes[HD * 32];
  __shared__ float scratch[32];
  __shared__ float vec[HD];
  const int c = threadIdx.x;
  if constexpr (S::KIND == KIND_F16 || S::KIND == KIND_BF16) {
    u16 h = S::KIND == KIND_F16 ? f2h(rows[c]) : f2bf(rows[c]);
    out[2 * c] = (u8)(h & 0xFF);
    out[2 * c + 1] = (u8)(h >> 8);
  } else if constexpr (S::KIND == KIND_FP8) {
    float x = rows[c];
    float amax = group_reduce<HD, true>(fabsf(x), scratch);
    u16 sh = f16_at_least((double)amax / 448.0);
    float scale = h2f(sh);
    if (c == 0) { out[0] = (u8)(sh & 0xFF); out[1] = (u8)(sh >> 8); }
    out[2 + c] = scale == 0.0f ? (u8)0 : f2e4m3(__fdiv_rn(x, scale));
  } else if constexpr (S::KIND == KIND_Q8_0) {
    float x = rows[c];
    float amax = warp_max(fabsf(x));
    float d = __fdiv_rn(amax, 127.0f);
    float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    u8* blk = out + (c / 32) * 34;
    if (c % 32 == 0) { u16 h = f2h(d); blk[0] = (u8)(h & 0xFF); blk[1] = (u8)(h >> 8); }
    blk[2 + c % 32] = (u8)(signed char)roundf(__fmul_rn(x, id));
  } else if constexpr (S::KIND == KIND_Q4_0) {
    float x = rows[c];
    // First value of largest magnitude, with its sign.
    float a = fabsf(x);
    int lane = c % 32;
    float best = a; int at = lane;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float ob = __shfl_xor_sync(0xffffffffu, best, o);
      int oat = __shfl_xor_sync(0xffffffffu, at, o);
      if (ob > best || (ob == best && oat < at)) { best = ob; at = oat; }
    }
    float mx = __shfl_sync(0xffffffffu, x, at);
    float d = __fdiv_rn(mx, -8.0f);
    float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    int n = (int)(signed char)(int)truncf(__fadd_rn(__fmul_rn(x, id), 8.5f));
    n = min(n, 15);
    int hi = __shfl_down_sync(0xffffffffu, n, 16);
    u8* blk = out + (c / 32) * 18;
    if (lane == 0) { u16 h = f2h(d); blk[0] = (u8)(h & 0xFF); blk[1] = (u8)(h >> 8); }
    if (lane < 16) blk[2 + lane] = (u8)((n & 0xF) | ((hi & 0xF) << 4));
  } else if constexpr (S::KIND == KIND_UNI_TOKEN || S::KIND == KIND_UNI_CHANNEL) {
    const int P = S::SYM ? 2 : 4;
    const int maxc = (1 << S::BITS) - 1;
    const int T = S::KIND == KIND_UNI_CHANNEL ? S::BT : 1;
    float lo, hi;
    if constexpr (S::KIND == KIND_UNI_TOKEN) {
      lo = group_reduce<S::GROUP, false>(rows[c], scratch);
      hi = group_reduce<S::GROUP, true>(rows[c], scratch);
    } else {
      lo = INFINITY; hi = -INFINITY;
      for (int t = 0; t < T; t++) { lo = fminf(lo, rows[t * HD + c]); hi = fmaxf(hi, rows[t * HD + c]); }
    }
    float scale, minv, zero;
    u16 sh, mh = 0;
    if constexpr (S::SYM) {
      double qmax = (double)((1 << (S::BITS - 1)) - 1);
      sh = f16_at_least(fmax(fabs((double)lo), fabs((double)hi)) / qmax);
      minv = 0.0f; zero = (float)(1 << (S::BITS - 1));
    } else {
      mh = f16_at_most((double)lo);
      sh = f16_at_least(((double)hi - (double)h2f(mh)) / (double)maxc);
      minv = h2f(mh); zero = 0.0f;
    }
    scale = h2f(sh);
    bool writer = S::KIND == KIND_UNI_CHANNEL || (c % S::GROUP) == 0;
    if (writer) {
      int g = S::KIND == KIND_UNI_CHANNEL ? c : c / S::GROUP;
      out[g * P] = (u8)(sh & 0xFF); out[g * P + 1] = (u8)(sh >> 8);
      if (!S::SYM) { out[g * P + 2] = (u8)(mh & 0xFF); out[g * P + 3] = (u8)(mh >> 8); }
    }
    for (int t = 0; t < T; t++) {
      float x = rows[t * HD + c];
      int code;
      if (scale == 0.0f) code = (int)zero;
      else code = (int)fminf(fmaxf(roundf(__fadd_rn(__fdiv_rn(__fsub_rn(x, minv), scale), zero)), 0.0f), (float)maxc);
      codes[t * HD + c] = (u8)code;
    }
    __syncthreads();
    int params = (S::KIND == KIND_UNI_CHANNEL ? HD : HD / S::GROUP) * P;
    pack_codes(codes, T * HD, S::BITS, out + params);
  } else if constexpr (S::KIND == KIND_TURBO) {
    // norm in f64 as the CPU does; unit vector; y = Π·unit; nearest centroid per coordinate.
    double x = (double)rows[c];
    __shared__ double dscratch[8];
    double sq = x * x;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
    __syncthreads();
    if (c % 32 == 0) dscratch[c / 32] = sq;
    __syncthreads();
    double tot = 0.0;
    for (int i = 0; i < HD / 32; i++) tot += dscratch[i];
    double n64 = sqrt(tot);
    vec[c] = n64 > 0.0 ? (float)(x / n64) : 0.0f;
    if (c == 0) { u16 h = f2h((float)n64); out[0] = (u8)(h & 0xFF); out[1] = (u8)(h >> 8); }
    __syncthreads();
    float y = 0.0f;
    for (int i = 0; i < HD; i++) y = fmaf(rot[c * HD + i], vec[i], y);
    int bits = c < S::SEG0 ? S::B0 : S::B1;
    int code = 0;
    for (int i = 0; i < (1 << bits) - 1; i++) code += (c < S::SEG0 ? S::bnd0(i) : S::bnd1(i)) < y;
    codes[c] = (u8)code;
    __syncthreads();
    pack_codes(codes, S::SEG0, S::B0, out + 2);
    if (S::SEG0 < HD) pack_codes(codes + S::SEG0, HD - S::SEG0, S::B1, out + 2 + S::SEG0 * S::B0 / 8);
  }
}

template <class S>
__device__ void encode_paged(const float* rows, int n_tok, int first_pos, const int* block_table,
                             int max_pages, u8* pool, u64 page_bytes, u64 region, u64 head_bytes,
                             int n_kv, const float* rot) {
  int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int pos = first_pos + blk * S::BT;
  // Gather this block's rows (BT tokens of head h) into a contiguous staging area.
  __shared__ float staged[HD * 32];
  for (int t = 0; t < S::BT; t++)
    staged[t * HD + threadIdx.x] =
        rows[(((u64)b * n_tok + blk * S::BT + t) * n_kv + h) * HD + threadIdx.x];
  __syncthreads();
  int page = block_table[b * max_pages + pos / PT];
  u8* out = pool + (u64)page * page_bytes + region + h * head_bytes + (u64)((pos % PT) / S::BT) * S::BB;
  encode_block<S>(staged, out, rot);
}

extern "C" __global__ void encode_k(const float* rows, int n_tok, int first_pos, const int* block_table,
                                    int max_pages, u8* pool, u64 page_bytes, u64 k_head_bytes,
                                    u64 v_head_bytes, int n_kv, const float* rot) {
  encode_paged<KS>(rows, n_tok, first_pos, block_table, max_pages, pool, page_bytes, 0, k_head_bytes,
                   n_kv, rot);
}
extern "C" __global__ void encode_v(const float* rows, int n_tok, int first_pos, const int* block_table,
                                    int max_pages, u8* pool, u64 page_bytes, u64 k_head_bytes,
                                    u64 v_head_bytes, int n_kv, const float* rot) {
  encode_paged<VS>(rows, n_tok, first_pos, block_table, max_pages, pool, page_bytes,
                   (u64)n_kv * k_head_bytes, v_head_bytes, n_kv, rot);
}

// ---------------------------------------------------------------------------------------------
// Fused paged decode attention, split over the context. grid = (splits, n_kv, batch), 128
// threads. A lane owns CPL channels of one token slot; LPT = HD / CPL lanes share a token, so a
// block works on SLOTS = 128 / LPT tokens at a time, and the GQ query heads of the KV head group
// all use each K/V byte loaded. q is [batch][n_kv * GQ][HD], prepared (rotated for turbo keys)
// and pre-multiplied by softmax_scale·log2(e). Partials: acc [batch][heads][splits][HD] (value
// space, unnormalised), ml [batch][heads][splits][2] (running max in log2 units, sum).

#define LPT (HD / CPL)
#define SLOTS (128 / LPT)

extern "C" __global__ void __launch_bounds__(128) attn_partial(
    const u8* __restrict__ pool, u64 page_bytes, u64 k_head_bytes, u64 v_head_bytes, int n_kv,
    const int* __restrict__ block_table, int max_pages, const int* __restrict__ seq_lens,
    const float* __restrict__ q, float* __restrict__ part_acc, float* __restrict__ part_ml,
    int splits, int split_tokens) {
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, slot = tid / LPT, c0 = (tid % LPT) * CPL;
  const int len = seq_lens[b];
  const int start = split * split_tokens;
  const int end = min(len, start + split_tokens);

  float qr[GQ][CPL];
#pragma unroll
  for (int g = 0; g < GQ; g++)
#pragma unroll
    for (int i = 0; i < CPL; i++) qr[g][i] = q[((u64)b * n_kv * GQ + h * GQ + g) * HD + c0 + i];
  float m[GQ], l[GQ], acc[GQ][CPL];
#pragma unroll
  for (int g = 0; g < GQ; g++) {
    m[g] = -INFINITY; l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < CPL; i++) acc[g][i] = 0.0f;
  }
  const int* table = block_table + (u64)b * max_pages;
  const u64 v_region = (u64)n_kv * k_head_bytes + (u64)h * v_head_bytes;

  for (int t0 = start; t0 < end; t0 += SLOTS * UNROLL) {
    float kx[UNROLL][CPL], vx[UNROLL][CPL];
    bool live[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      int t = t0 + slot + u * SLOTS;
      live[u] = t < end;
      int tc = live[u] ? t : start;
      const u8* page = pool + (u64)table[tc / PT] * page_bytes;
#pragma unroll
      for (int j = 0; j < CPL; j += 8) {
        load8<KS>(page + (u64)h * k_head_bytes, tc % PT, c0 + j, &kx[u][j]);
        load8<VS>(page + v_region, tc % PT, c0 + j, &vx[u][j]);
      }
    }
    float s[UNROLL][GQ];
#pragma unroll
    for (int u = 0; u < UNROLL; u++)
#pragma unroll
      for (int g = 0; g < GQ; g++) {
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < CPL; i++) d = fmaf(qr[g][i], kx[u][i], d);
#pragma unroll
        for (int o = LPT / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        s[u][g] = live[u] ? d : -INFINITY;
      }
#pragma unroll
    for (int g = 0; g < GQ; g++) {
      float mn = m[g];
#pragma unroll
      for (int u = 0; u < UNROLL; u++) mn = fmaxf(mn, s[u][g]);
      float corr = exp2f(m[g] - mn);
      m[g] = mn;
      l[g] *= corr;
#pragma unroll
      for (int i = 0; i < CPL; i++) acc[g][i] *= corr;
#pragma unroll
      for (int u = 0; u < UNROLL; u++) {
        float p = exp2f(s[u][g] - mn);
        l[g] += p;
#pragma unroll
        for (int i = 0; i < CPL; i++) acc[g][i] = fmaf(p, vx[u][i], acc[g][i]);
      }
    }
  }

  // Merge the SLOTS token slots of this block.
  __shared__ float sm[SLOTS][GQ], sl[SLOTS][GQ];
  __shared__ float sacc[SLOTS][GQ][HD];
  if (tid % LPT == 0) {
#pragma unroll
    for (int g = 0; g < GQ; g++) { sm[slot][g] = m[g]; sl[slot][g] = l[g]; }
  }
#pragma unroll
  for (int g = 0; g < GQ; g++)
#pragma unroll
    for (int i = 0; i < CPL; i++) sacc[slot][g][c0 + i] = acc[g][i];
  __syncthreads();
  for (int idx = tid; idx < GQ * HD; idx += 128) {
    int g = idx / HD, c = idx % HD;
    float mx = -INFINITY;
    for (int k = 0; k < SLOTS; k++) mx = fmaxf(mx, sm[k][g]);
    float a = 0.0f, sum = 0.0f;
    if (mx != -INFINITY) {
      for (int k = 0; k < SLOTS; k++) {
        float w = exp2f(sm[k][g] - mx);
        a += w * sacc[k][g][c];
        sum += w * sl[k][g];
      }
    }
    u64 row = ((u64)b * n_kv * GQ + h * GQ + g) * splits + split;
    part_acc[row * HD + c] = a;
    if (c == 0) { part_ml[2 * row] = mx; part_ml[2 * row + 1] = sum; }
  }
}

// Merges the splits: out [batch][heads][HD] = Σ_s 2^(m_s − M)·acc_s / Σ_s 2^(m_s − M)·l_s.
// grid = (heads, batch), HD threads.
extern "C" __global__ void attn_merge(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                      float* __restrict__ out, int heads, int splits) {
  const int hq = blockIdx.x, b = blockIdx.y, c = threadIdx.x;
  const u64 base = ((u64)b * heads + hq) * splits;
  float mx = -INFINITY;
  for (int s = 0; s < splits; s++) mx = fmaxf(mx, part_ml[2 * (base + s)]);
  float a = 0.0f, sum = 0.0f;
  for (int s = 0; s < splits; s++) {
    float ms = part_ml[2 * (base + s)];
    if (ms == -INFINITY) continue;
    float w = exp2f(ms - mx);
    a += w * part_acc[(base + s) * HD + c];
    sum += w * part_ml[2 * (base + s) + 1];
  }
  out[((u64)b * heads + hq) * HD + c] = sum > 0.0f ? a / sum : 0.0f;
}

// y[r] = M·x[r] (transpose = 0) or Mᵀ·x[r] (transpose = 1), times `factor`, for rows of HD;
// M is HD × HD row-major. grid = rows, HD threads. Rotates queries and turbo outputs.
extern "C" __global__ void apply_matrix(const float* __restrict__ mat, const float* __restrict__ x,
                                        float* __restrict__ y, int transpose, float factor) {
  __shared__ float xs[HD];
  const int r = blockIdx.x, c = threadIdx.x;
  xs[c] = x[(u64)r * HD + c];
  __syncthreads();
  float a = 0.0f;
  for (int i = 0; i < HD; i++) a = fmaf(transpose ? mat[i * HD + c] : mat[c * HD + i], xs[i], a);
  y[(u64)r * HD + c] = a * factor;
}

// Fills n floats with uniform values in [-1, 1) from a counter hash (benchmark caches).
extern "C" __global__ void fill_uniform(float* x, u64 n, u64 seed) {
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    u64 z = (i + seed * 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 31; z *= 0x94D049BB133111EBull; z ^= z >> 29;
    x[i] = (float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
  }
}

// gpu-info self test: y[i] = f16(x[i]) * 2 through the same PTX conversions the codecs use.
extern "C" __global__ void self_test(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * h2f(f2h(x[i]));
}
