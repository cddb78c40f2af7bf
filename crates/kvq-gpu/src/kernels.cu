// kvq-gpu kernels, compiled at run time by NVRTC. Header-free: f16/bf16/fp8 conversions are
// inline PTX. The Rust side prepends a prelude that defines HD (head_dim), GQ (query heads per KV
// head, at most 8), PT (tokens per page, a multiple of 16), and the structs KS and VS that
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
// f32 -> f16 / bf16 bits. The conversions write a 32-bit pair register and the bits leave it by
// integer ops. With the 16-bit form (cvt.rn.f16.f32 into a .b16 register, low byte stored by
// st.u8) byte 0 of f16/bf16/q8_0/q4_0/turbo blocks came out as the value truncated to an integer
// on the H200; with this form every block matches the CPU codec (see bench/gpu/NOTES.md).
__device__ __forceinline__ u32 f2h32(float f) { u32 r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(0.0f), "f"(f)); return r & 0xFFFFu; }
__device__ __forceinline__ u16 f2h(float f) { return (u16)f2h32(f); }
__device__ __forceinline__ u16 d2h(double d) { u16 h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h; }
__device__ __forceinline__ u16 f2bf(float f) { u32 r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(0.0f), "f"(f)); return (u16)(r & 0xFFFFu); }
__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }
// Stores the low 16 bits of `bits` at the 2-byte aligned `p` (every block starts 2-byte aligned).
__device__ __forceinline__ void st16(u8* p, u32 bits) { *(u16*)p = (u16)bits; }
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

// ---------------------------------------------------------------------------------------------
// Decode to f16 pairs for the tensor-core attention. load8h<S> decodes 8 channels c0 .. c0+7 of
// token t (within the page) into 4 half2 words; word i holds channels chan8<S>(i, 0) and
// chan8<S>(i, 1) (low, high half) — pairs (2i, 2i+1), or (i, i+4) where the packing makes that
// cheaper (4- and 2-bit codes). Integer codes become f16 by the magic-number trick
// (0x6400 | n is 1024 + n exactly), so decode is a few integer ops and f16x2 ops per pair.
// Turbo rows decode to rotated coordinates (the query is rotated to match).

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 d; asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel)); return d;
}
__device__ __forceinline__ u32 hsub2(u32 a, u32 b) { u32 d; asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) { u32 d; asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d; }
__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) { u32 d; asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d; }
// f16 pair {lo, hi} from two floats.
__device__ __forceinline__ u32 pack2f(float lo, float hi) { u32 d; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo)); return d; }
__device__ __forceinline__ u32 dup16(u32 h) { return (h & 0xFFFFu) * 0x10001u; }

template <class S>
struct Interleaved { enum { V = (S::KIND == KIND_UNI_TOKEN || S::KIND == KIND_UNI_CHANNEL) && S::BITS < 8 }; };
// Channel (0..7, relative to c0) in half e of word i of load8h<S>.
template <class S>
__device__ __forceinline__ int chan8(int i, int e) { return Interleaved<S>::V ? i + 4 * e : 2 * i + e; }

// 8 codes of BITS (8, 4 or 2) bits, LSB first, as f16 pairs 1024 + code in chan8 order.
template <int BITS>
__device__ __forceinline__ void codes8(u64 w, u32* o) {
  if constexpr (BITS == 8) {
    u32 lo = (u32)w, hi = (u32)(w >> 32);
    o[0] = prmt(lo, 0x64646464u, 0x4140); o[1] = prmt(lo, 0x64646464u, 0x4342);
    o[2] = prmt(hi, 0x64646464u, 0x4140); o[3] = prmt(hi, 0x64646464u, 0x4342);
  } else if constexpr (BITS == 4) {
    u32 x = (u32)w;
#pragma unroll
    for (int i = 0; i < 4; i++) o[i] = ((x >> (4 * i)) & 0x000F000Fu) | 0x64006400u;
  } else {
    u32 x = ((u32)w & 0xFFu) | (((u32)w & 0xFF00u) << 8);
#pragma unroll
    for (int i = 0; i < 4; i++) o[i] = ((x >> (2 * i)) & 0x00030003u) | 0x64006400u;
  }
}

template <class S>
__device__ __forceinline__ void load8h(const u8* run, int t, int c0, u32* o, const u32 (*lut)[32]) {
  if constexpr (S::KIND == KIND_F16) {
    uint4 w = *(const uint4*)(run + (u64)t * S::BB + 2 * c0);
    o[0] = w.x; o[1] = w.y; o[2] = w.z; o[3] = w.w;
  } else if constexpr (S::KIND == KIND_BF16) {
    uint4 w = *(const uint4*)(run + (u64)t * S::BB + 2 * c0);
    u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) o[i] = pack2f(__uint_as_float(ws[i] << 16), __uint_as_float(ws[i] & 0xFFFF0000u));
  } else if constexpr (S::KIND == KIND_FP8) {
    const u8* row = run + (u64)t * S::BB;
    u32 s2 = dup16(ld16(row));
    u64 w = load_bytes<8>(row + 2 + c0);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      u32 h2;
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((u16)(w >> (16 * i))));
      o[i] = hmul2(h2, s2);
    }
  } else if constexpr (S::KIND == KIND_Q8_0) {
    const u8* blk = run + (u64)t * S::BB + (c0 / 32) * 34;
    u32 d2 = dup16(ld16(blk));
    u64 w = load_bytes<8>(blk + 2 + (c0 % 32)) ^ 0x8080808080808080ull;
    codes8<8>(w, o);
#pragma unroll
    for (int i = 0; i < 4; i++) o[i] = hmul2(hsub2(o[i], 0x64806480u), d2);  // - (1024 + 128)
  } else if constexpr (S::KIND == KIND_Q4_0) {
    const u8* blk = run + (u64)t * S::BB + (c0 / 32) * 18;
    u32 d2 = dup16(ld16(blk));
    int j = c0 % 32;
    u64 w = load_bytes<8>(blk + 2 + (j % 16));
    u32 lo = ((u32)w >> (j < 16 ? 0 : 4)) & 0x0F0F0F0Fu, hi = ((u32)(w >> 32) >> (j < 16 ? 0 : 4)) & 0x0F0F0F0Fu;
    o[0] = prmt(lo, 0x64646464u, 0x4140); o[1] = prmt(lo, 0x64646464u, 0x4342);
    o[2] = prmt(hi, 0x64646464u, 0x4140); o[3] = prmt(hi, 0x64646464u, 0x4342);
#pragma unroll
    for (int i = 0; i < 4; i++) o[i] = hmul2(hsub2(o[i], 0x64086408u), d2);  // - (1024 + 8)
  } else if constexpr (S::KIND == KIND_UNI_TOKEN) {
    const int P = S::SYM ? 2 : 4;
    const u8* row = run + (u64)t * S::BB;
    const u8* par = row + (c0 / S::GROUP) * P;
    codes8<S::BITS>(load_bytes<S::BITS>(row + (HD / S::GROUP) * P + c0 * S::BITS / 8), o);
    u32 s2 = dup16(ld16(par));
    if constexpr (S::SYM) {
      u32 z = dup16(0x6400u | (1u << (S::BITS - 1)));
#pragma unroll
      for (int i = 0; i < 4; i++) o[i] = hmul2(hsub2(o[i], z), s2);
    } else {
      u32 m2 = dup16(ld16(par + 2));
#pragma unroll
      for (int i = 0; i < 4; i++) o[i] = hfma2(hsub2(o[i], 0x64006400u), s2, m2);
    }
  } else if constexpr (S::KIND == KIND_UNI_CHANNEL) {
    const int P = S::SYM ? 2 : 4;
    const u8* blk = run + (u64)(t / S::BT) * S::BB;
    codes8<S::BITS>(load_bytes<S::BITS>(blk + HD * P + (t % S::BT) * (HD * S::BITS / 8) + c0 * S::BITS / 8), o);
    // Per-channel (scale, min) of channels c0 .. c0+7: 16 or 32 aligned bytes.
    const uint4* pp = (const uint4*)(blk + c0 * P);
    uint4 a = pp[0];
    u32 pw[8] = {a.x, a.y, a.z, a.w, 0, 0, 0, 0};
    if constexpr (!S::SYM) { uint4 b2 = pp[1]; pw[4] = b2.x; pw[5] = b2.y; pw[6] = b2.z; pw[7] = b2.w; }
#pragma unroll
    for (int i = 0; i < 4; i++) {
      int ca = chan8<S>(i, 0), cb = chan8<S>(i, 1);
      if constexpr (S::SYM) {
        u32 s2 = prmt(pw[ca / 2], pw[cb / 2], (ca % 2 ? 0x32 : 0x10) | (cb % 2 ? 0x7600 : 0x5400));
        o[i] = hmul2(hsub2(o[i], dup16(0x6400u | (1u << (S::BITS - 1)))), s2);
      } else {
        u32 s2 = prmt(pw[ca], pw[cb], 0x5410), m2 = prmt(pw[ca], pw[cb], 0x7632);
        o[i] = hfma2(hsub2(o[i], 0x64006400u), s2, m2);
      }
    }
  } else if constexpr (S::KIND == KIND_TURBO) {
    const u8* row = run + (u64)t * S::BB;
    u32 n2 = dup16(ld16(row));
    const int lane = threadIdx.x % 32;
    if (c0 < S::SEG0) {
      u64 w = load_bytes<S::B0>(row + 2 + c0 * S::B0 / 8);
#pragma unroll
      for (int i = 0; i < 4; i++) {
        u32 a = lut[(w >> (S::B0 * 2 * i)) & ((1u << S::B0) - 1)][lane];
        u32 b = lut[(w >> (S::B0 * (2 * i + 1))) & ((1u << S::B0) - 1)][lane];
        o[i] = hmul2(a | (b << 16), n2);
      }
    } else {
      u64 w = load_bytes<S::B1>(row + 2 + S::SEG0 * S::B0 / 8 + (c0 - S::SEG0) * S::B1 / 8);
#pragma unroll
      for (int i = 0; i < 4; i++) {
        u32 a = lut[16 + ((w >> (S::B1 * 2 * i)) & ((1u << S::B1) - 1))][lane];
        u32 b = lut[16 + ((w >> (S::B1 * (2 * i + 1))) & ((1u << S::B1) - 1))][lane];
        o[i] = hmul2(a | (b << 16), n2);
      }
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
    st16(out + 2 * c, h);
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
    if (c % 32 == 0) st16(blk, f2h32(d));
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
    if (lane == 0) st16(blk, f2h32(d));
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
    if (c == 0) st16(out, f2h32((float)n64));
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
// Fused paged decode attention on tensor cores, split over the context. grid = (splits, n_kv,
// batch), 4 warps. Each warp takes 16 tokens at a time (warp w: tokens start + 16·w + 64·i) and
// runs two mma.sync.m16n8k16 (f16 in, f32 accumulate) products per step:
//   S (16 rows = the GQ query heads of the group, zero-padded × 16 tokens) = Q · Kᵀ over HD,
//   O (16 × HD) += P · V,
// so the arithmetic is on tensor cores and the lanes only decode bytes to f16 pairs. Which
// channel feeds which MMA position is free (a dot product does not care about the order), so
// each lane decodes whole runs of channels: for K, lane (n = lane/4, c = lane%4) decodes channels
// [c·HD/4, (c+1)·HD/4) of two tokens; for V, lane (r = lane/4, c) decodes channels
// [r·HD/8, (r+1)·HD/8) of the four tokens 4c .. 4c+3 of the step, and tokens are numbered so the
// S accumulator is P's A fragment as it stands (no shuffles). q is [batch][n_kv·GQ][HD],
// prepared (rotated for turbo keys) and pre-multiplied by softmax_scale·log2(e). Partials: acc
// [batch][heads][splits][HD] (value space, unnormalised), ml [batch][heads][splits][2]
// (running max in log2 units, sum).

#define WARPS 4

__device__ __forceinline__ void mma16816(float* d, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Token (0..15 within the step) of key column n (0..7) of score tile `tile` (0 or 1).
__device__ __forceinline__ int key_token(int tile, int n) { return 4 * (n / 2) + 2 * tile + n % 2; }

// Shared-memory staging of one warp step (16 tokens from page token p0, p0 % 16 == 0) of a
// compressed layout: the rows' bytes, or for channel-wise blocks (32 tokens) the block's
// per-channel parameters followed by the 16 rows' codes, so that load8h reads the copy with
// t = 0 .. 15. f16/bf16 rows are read straight from global memory (one 16-byte load per 8
// channels already).
template <class S>
struct Stage {
  enum {
    ON = S::KIND != KIND_F16 && S::KIND != KIND_BF16,
    PAR = S::KIND == KIND_UNI_CHANNEL ? HD * (S::SYM ? 2 : 4) : 0,
    ROW = S::KIND == KIND_UNI_CHANNEL ? HD * S::BITS / 8 : S::BB,
    CHUNKS = (PAR + 16 * ROW) / 16,
    PER_LANE = (CHUNKS + 31) / 32
  };
  // 16-byte chunk i of the step's bytes in the head's run of blocks `run`.
  static __device__ __forceinline__ const uint4* src(const u8* run, int p0, int i) {
    if constexpr (S::KIND == KIND_UNI_CHANNEL) {
      const u8* blk = run + (u64)(p0 / S::BT) * S::BB;
      int off = 16 * i;
      return (const uint4*)(off < PAR ? blk + off : blk + PAR + (p0 % S::BT) * ROW + (off - PAR));
    } else {
      return (const uint4*)(run + (u64)p0 * S::BB + 16 * i);
    }
  }
};

extern "C" __global__ void __launch_bounds__(128) attn_partial(
    const u8* __restrict__ pool, u64 page_bytes, u64 k_head_bytes, u64 v_head_bytes, int n_kv,
    const int* __restrict__ block_table, int max_pages, const int* __restrict__ seq_lens,
    const float* __restrict__ q, float* __restrict__ part_acc, float* __restrict__ part_ml,
    int splits, int split_tokens) {
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  const int len = seq_lens[b];
  const int start = split * split_tokens;
  const int end = min(len, start + split_tokens);
  constexpr int KCH = HD / 4, VCH = HD / 8;  // channels a lane decodes per K / V token
  constexpr int KG = KCH / 8, VG = VCH / 8;  // in groups of 8

  // Turbo codebooks as f16, one copy per lane (conflict-free lookups): [role][code][lane].
  __shared__ u32 lut[2][32][32];
  if constexpr (KS::KIND == KIND_TURBO || VS::KIND == KIND_TURBO) {
    for (int i = tid; i < 2 * 32 * 32; i += 128) {
      int role = i / 1024, e = (i / 32) % 32;
      float x = role == 0 ? (e < 16 ? KS::lut0(e) : KS::lut1(e - 16)) : (e < 16 ? VS::lut0(e) : VS::lut1(e - 16));
      lut[role][e][i % 32] = f2h32(x);
    }
    __syncthreads();
  }

  // Q as the A fragment of S = Q·Kᵀ: k-chunk kc holds, for row gid, K word (kc%2)·2 (+1) of
  // channel group kc/2 of the lane with this tig. Rows ≥ GQ (and rows 8..15) are zero.
  u32 qa[HD / 16][4];
  const float* qrow = q + ((u64)b * n_kv * GQ + h * GQ + min(gid, GQ - 1)) * HD + tig * KCH;
#pragma unroll
  for (int kc = 0; kc < HD / 16; kc++) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
      int wi = (kc % 2) * 2 + half, base = (kc / 2) * 8;
      u32 v = pack2f(qrow[base + chan8<KS>(wi, 0)], qrow[base + chan8<KS>(wi, 1)]);
      qa[kc][2 * half] = gid < GQ ? v : 0u;
    }
    qa[kc][1] = 0u; qa[kc][3] = 0u;
  }

  float oacc[HD / 8][4];
#pragma unroll
  for (int nt = 0; nt < HD / 8; nt++) oacc[nt][0] = oacc[nt][1] = oacc[nt][2] = oacc[nt][3] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int* table = block_table + (u64)b * max_pages;
  const u64 v_region = (u64)n_kv * k_head_bytes + (u64)h * v_head_bytes;

  // Compressed layouts: each warp copies its step's K and V bytes into shared memory with 16-byte
  // loads (coalesced, the next step's already in flight in registers) and decodes from there.
  __shared__ uint4 kst[WARPS][Stage<KS>::ON ? Stage<KS>::CHUNKS : 1];
  __shared__ uint4 vst[WARPS][Stage<VS>::ON ? Stage<VS>::CHUNKS : 1];
  uint4 kreg[Stage<KS>::ON ? Stage<KS>::PER_LANE : 1], vreg[Stage<VS>::ON ? Stage<VS>::PER_LANE : 1];
  auto fetch = [&](int t) {
    const u8* pg = pool + (u64)table[t / PT] * page_bytes;
    if constexpr (Stage<KS>::ON) {
#pragma unroll
      for (int r = 0; r < Stage<KS>::PER_LANE; r++)
        if (lane + 32 * r < Stage<KS>::CHUNKS) kreg[r] = *Stage<KS>::src(pg + (u64)h * k_head_bytes, t % PT, lane + 32 * r);
    }
    if constexpr (Stage<VS>::ON) {
#pragma unroll
      for (int r = 0; r < Stage<VS>::PER_LANE; r++)
        if (lane + 32 * r < Stage<VS>::CHUNKS) vreg[r] = *Stage<VS>::src(pg + v_region, t % PT, lane + 32 * r);
    }
  };
  if (start + 16 * warp < end) fetch(start + 16 * warp);

  for (int t0 = start + 16 * warp; t0 < end; t0 += 16 * WARPS) {
    const u8* page = pool + (u64)table[t0 / PT] * page_bytes;  // PT % 16 == 0: one page per step
    const int p0 = t0 % PT;
    if constexpr (Stage<KS>::ON || Stage<VS>::ON) {
      __syncwarp();
#pragma unroll
      for (int r = 0; r < Stage<KS>::PER_LANE; r++)
        if (Stage<KS>::ON && lane + 32 * r < Stage<KS>::CHUNKS) kst[warp][lane + 32 * r] = kreg[r];
#pragma unroll
      for (int r = 0; r < Stage<VS>::PER_LANE; r++)
        if (Stage<VS>::ON && lane + 32 * r < Stage<VS>::CHUNKS) vst[warp][lane + 32 * r] = vreg[r];
      __syncwarp();
      if (t0 + 16 * WARPS < end) fetch(t0 + 16 * WARPS);
    }
    const u8* krun = Stage<KS>::ON ? (const u8*)kst[warp] : page + (u64)h * k_head_bytes;
    const u8* vrun = Stage<VS>::ON ? (const u8*)vst[warp] : page + v_region;
    const int kp = Stage<KS>::ON ? 0 : p0, vp = Stage<VS>::ON ? 0 : p0;
    // Keys: tokens key_token(0, gid) and key_token(1, gid), channels tig·KCH ...
    u32 kw[2][KG][4];
#pragma unroll
    for (int tile = 0; tile < 2; tile++) {
      int tk = key_token(tile, gid);
      int tt = kp + (t0 + tk < end ? tk : 0);
#pragma unroll
      for (int j = 0; j < KG; j++) load8h<KS>(krun, tt, tig * KCH + 8 * j, kw[tile][j], lut[0]);
    }
    // Values: tokens 4·tig .. 4·tig+3, channels gid·VCH ...
    u32 vw[4][VG][4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      int tv = 4 * tig + u;
      int tt = vp + (t0 + tv < end ? tv : 0);
#pragma unroll
      for (int j = 0; j < VG; j++) load8h<VS>(vrun, tt, gid * VCH + 8 * j, vw[u][j], lut[1]);
    }
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int tile = 0; tile < 2; tile++)
#pragma unroll
      for (int kc = 0; kc < HD / 16; kc++)
        mma16816(s[tile], qa[kc], kw[tile][kc / 2][(kc % 2) * 2], kw[tile][kc / 2][(kc % 2) * 2 + 1]);
    // Row gid holds tokens key_token(tile, 2·tig + e) = 4·tig + 2·tile + e.
    float mx = -INFINITY;
#pragma unroll
    for (int tile = 0; tile < 2; tile++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        if (t0 + 4 * tig + 2 * tile + e >= end) s[tile][e] = -INFINITY;
        mx = fmaxf(mx, s[tile][e]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m, mx);
    const float corr = exp2f(m - mn);
    m = mn;
    float p[2][2];
#pragma unroll
    for (int tile = 0; tile < 2; tile++)
#pragma unroll
      for (int e = 0; e < 2; e++) p[tile][e] = exp2f(s[tile][e] - mn);
    l = l * corr + (p[0][0] + p[0][1]) + (p[1][0] + p[1][1]);
    const u32 pa[4] = {pack2f(p[0][0], p[0][1]), 0u, pack2f(p[1][0], p[1][1]), 0u};
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) {
      oacc[nt][0] *= corr; oacc[nt][1] *= corr;
      // n-tile nt, column gid: channel gid·VCH + 8·(nt/8) + chan8(word (nt%8)/2, half nt%2).
      int j = nt / 8, wi = (nt % 8) / 2;
      u32 sel = nt % 2 ? 0x7632u : 0x5410u;
      mma16816(oacc[nt], pa, prmt(vw[0][j][wi], vw[1][j][wi], sel), prmt(vw[2][j][wi], vw[3][j][wi], sel));
    }
  }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  // Merge the warps of this block.
  __shared__ float sm[WARPS][GQ], sl[WARPS][GQ];
  __shared__ float sacc[WARPS][GQ][HD];
  if (gid < GQ) {
    if (tig == 0) { sm[warp][gid] = m; sl[warp][gid] = l; }
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        int col = 2 * tig + e;  // the V lane whose channels this column carries
        sacc[warp][gid][col * VCH + 8 * (nt / 8) + chan8<VS>((nt % 8) / 2, nt % 2)] = oacc[nt][e];
      }
  }
  __syncthreads();
  for (int idx = tid; idx < GQ * HD; idx += 128) {
    int g = idx / HD, c = idx % HD;
    float mxs = -INFINITY;
    for (int k = 0; k < WARPS; k++) mxs = fmaxf(mxs, sm[k][g]);
    float a = 0.0f, sum = 0.0f;
    if (mxs != -INFINITY) {
      for (int k = 0; k < WARPS; k++) {
        float w = exp2f(sm[k][g] - mxs);
        a += w * sacc[k][g][c];
        sum += w * sl[k][g];
      }
    }
    u64 row = ((u64)b * n_kv * GQ + h * GQ + g) * splits + split;
    part_acc[row * HD + c] = a;
    if (c == 0) { part_ml[2 * row] = mxs; part_ml[2 * row + 1] = sum; }
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
