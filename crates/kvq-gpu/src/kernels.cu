// kvq-gpu kernels, compiled at run time by NVRTC. Header-free: f16/bf16/fp8 conversions are
// inline PTX. The Rust side prepends a prelude that defines HD (head_dim), KD and VD (lengths of
// the prepared query and of the value accumulator: HD, or 2·HD for TurboQuant-prod, whose sign
// bits are coordinates HD .. 2·HD), GQ (query heads per KV head, at most 8), PT (tokens per page, a multiple of 16), MINB (attention blocks resident per
// multiprocessor, the launch bound), NSTAGE (cp.async ring depth), and the structs KS and VS that
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
#define KIND_PROD 8
#define KIND_OAKEN 9

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
struct Interleaved { enum { V = ((S::KIND == KIND_UNI_TOKEN || S::KIND == KIND_UNI_CHANNEL) && S::BITS < 8) || S::KIND == KIND_OAKEN }; };
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
// 16-channel decode from the shared-memory staging (version 3). dec16<S> decodes channels
// c0 .. c0+15 (c0 % 16 == 0) of one token into 8 half2 words; word w holds channels
// chan16<S>(w, 0) and chan16<S>(w, 1). For q4_0, q8_0, 4-bit per-token integers and 3-bit turbo
// the bytes are read as aligned 32-bit shared-memory words (32-bit addresses) and re-aligned with
// funnel shifts, instead of 1–2-byte loads assembled into 64-bit words; the other layouts decode
// with load8h twice. The ring has 16 spare bytes at its end, so the word after a run may be read.

__device__ __forceinline__ u32 lds32(u32 a) { u32 v; asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a)); return v; }
__device__ __forceinline__ u32 lds16(u32 a) { u16 v; asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a)); return v; }

template <class S>
struct Fast {
  enum {
    Q4 = S::KIND == KIND_Q4_0,
    Q8 = S::KIND == KIND_Q8_0,
    U4 = S::KIND == KIND_UNI_TOKEN && S::BITS == 4 && S::GROUP >= 16,
    T3 = S::KIND == KIND_TURBO && S::B0 == 3 && S::B1 == 3,
    PROD = S::KIND == KIND_PROD,
    OAK = S::KIND == KIND_OAKEN
  };
};

// Channel (relative to c0) in half e of word w (0..7) of dec16<S>.
template <class S>
__device__ __forceinline__ int chan16(int w, int e) {
  return Fast<S>::Q4 ? 4 * (w / 2) + (w % 2) + 2 * e : Fast<S>::PROD ? w + 8 * e : 8 * (w / 4) + chan8<S>(w % 4, e);
}
// Channel (relative to the run's start) in half e of word w of a run of N channels (decrun<S, N>).
template <class S, int N>
__device__ __forceinline__ int chanrun(int w, int e) {
  return N % 16 == 0 ? 16 * (w / 8) + chan16<S>(w % 8, e) : 8 * (w / 4) + chan8<S>(w % 4, e);
}

// Words W (≤ 5) from the aligned shared address below a, re-aligned to start at bit `sh` of the
// first: x[i] = bits [sh + 32·i, sh + 32·i + 32) of the little-endian byte run.
template <int W>
__device__ __forceinline__ void lds_run(u32 b, u32 sh, u32* x) {
  u32 w[W + 1];
#pragma unroll
  for (int i = 0; i <= W; i++) w[i] = lds32(b + 4 * i);
#pragma unroll
  for (int i = 0; i < W; i++) x[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

__device__ __forceinline__ u32 lds8(u32 a) { u16 v; asm volatile("ld.shared.u8 %0, [%1];" : "=h"(v) : "r"(a)); return v; }

// Oaken: the middle grid of the token row at shared address `row` (kvq-codec oaken.rs MiddleGrid:
// zero code z and step from the f16 middle range lo, hi; same f32 operations).
__device__ __forceinline__ void oaken_grid(u32 row, int& z, float& step) {
  const float lo = h2f((u16)lds16(row)), hi = h2f((u16)lds16(row + 2));
  const float range = __fsub_rn(hi, lo);
  if (!(range > 0.0f)) { z = 8; step = 0.0f; return; }
  z = min(max((int)roundf(__fdiv_rn(__fmul_rn(16.0f, -lo), range)), 1), 15);
  step = fmaxf(__fdividef(-lo, (float)z), __fdividef(hi, (float)(16 - z)));  // within 2 ulp
}

// Oaken: calls f(element, value − middle level of its dense code) for each sparse entry of the
// token row at shared address `row` (the correction the dense decode needs at that element).
template <class S, class F>
__device__ __forceinline__ void oaken_outliers(u32 row, F f) {
  constexpr int SP = (HD + 63) / 64;
  int z; float step;
  oaken_grid(row, z, step);
  const float outer_step = h2f((u16)lds16(row + 4)) * (1.0f / 15.0f), inner_step = h2f((u16)lds16(row + 6)) * (1.0f / 15.0f);
  const u32 dense = row + 8 + SP, sparse = dense + HD / 2;
  int j = 0;
#pragma unroll
  for (int span = 0; span < SP; span++) {
    const int count = (int)lds8(row + 8 + span);
#pragma unroll 1
    for (int k = 0; k < count && j < S::CAP; k++, j++) {
      const u32 e = lds8(sparse + j);
      const int i = span * 64 + (int)(e & 63u);
      const int code = (int)((lds8(dense + i / 2) >> (4 * (i & 1))) & 15u);
      const float mag = (float)code;
      float v;
      if (e & 0x40u) v = (e & 0x80u) ? S::LO_OUTER - mag * outer_step : S::HI_OUTER + mag * outer_step;
      else v = (e & 0x80u) ? -mag * inner_step : mag * inner_step;
      const float mid = ((float)(code - z) + 0.5f) * step + (code >= z ? S::HI_INNER : S::LO_INNER);
      f(i, v - mid);
    }
  }
}

// Fast layouts: `row` is the token's shared-memory address. Others: load8h on (run, t).
template <class S>
__device__ __forceinline__ void dec16(const u8* run, u32 row, int t, int c0, u32* o, const u32 (*lut)[32],
                                      const u32 (*plut)[32]) {
  if constexpr (Fast<S>::Q4) {
    const u32 blk = row + (c0 / 32) * 18, a = blk + 2;
    const u32 d2 = dup16(lds16(blk));
    u32 x[4];
    lds_run<4>(a & ~3u, 8 * (a & 3) + 4 * ((c0 / 16) & 1), x);  // high nibbles: 4 bits further
#pragma unroll
    for (int i = 0; i < 4; i++) {
      o[2 * i] = hmul2(hsub2((x[i] & 0x000F000Fu) | 0x64006400u, 0x64086408u), d2);
      o[2 * i + 1] = hmul2(hsub2(((x[i] >> 8) & 0x000F000Fu) | 0x64006400u, 0x64086408u), d2);
    }
  } else if constexpr (Fast<S>::Q8) {
    const u32 blk = row + (c0 / 32) * 34, a = blk + 2 + (c0 % 32);
    const u32 d2 = dup16(lds16(blk));
    u32 x[4];
    lds_run<4>(a & ~3u, 8 * (a & 3), x);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const u32 y = x[i] ^ 0x80808080u;
      o[2 * i] = hmul2(hsub2(prmt(y, 0x64646464u, 0x4140), 0x64806480u), d2);
      o[2 * i + 1] = hmul2(hsub2(prmt(y, 0x64646464u, 0x4342), 0x64806480u), d2);
    }
  } else if constexpr (Fast<S>::U4) {
    const int P = S::SYM ? 2 : 4;
    const u32 par = row + (c0 / S::GROUP) * P, a = row + (HD / S::GROUP) * P + c0 / 2;
    const u32 s2 = dup16(lds16(par));
    const u32 m2 = S::SYM ? 0u : dup16(lds16(par + 2));
    u32 x[2];
    lds_run<2>(a & ~3u, 8 * (a & 3), x);
#pragma unroll
    for (int k = 0; k < 2; k++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const u32 c = ((x[k] >> (4 * i)) & 0x000F000Fu) | 0x64006400u;
        if constexpr (S::SYM) o[4 * k + i] = hmul2(hsub2(c, 0x64086408u), s2);
        else o[4 * k + i] = hfma2(hsub2(c, 0x64006400u), s2, m2);
      }
  } else if constexpr (Fast<S>::T3) {
    // 48 bits of 3-bit codes; pair k (channels 2k, 2k+1) is bits 6k .. 6k+5, looked up in the
    // pair table (both centroids as one f16 pair).
    const u32 a = row + 2 + 6 * (c0 / 16);
    const u32 n2 = dup16(lds16(row));
    const int lane = threadIdx.x % 32;
    u32 x[2];
    lds_run<2>(a & ~3u, 8 * (a & 3), x);
    const u32 mid = __funnelshift_r(x[0], x[1], 30);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const u32 code = (k < 5 ? x[0] >> (6 * k) : k == 5 ? mid : x[1] >> (6 * k - 32)) & 63u;
      o[k] = hmul2(plut[code][lane], n2);
    }
  } else if constexpr (Fast<S>::PROD) {
    // TurboQuant-prod, logical channels c0 .. c0+15 in pairs (c0 + w, c0 + w + 8): below HD the
    // mse centroids times the norm, from HD on the QJL signs (±1) times the weight n·γ·√(π/2)/d.
    const int lane = threadIdx.x % 32;
    const u32 n = lds16(row), g = row + 2 + HD * S::B0 / 8;
    if (c0 < HD) {
      const u32 a = row + 2 + c0 * S::B0 / 8, n2 = dup16(n);
      u32 x[2];
      lds_run<2>(a & ~3u, 8 * (a & 3), x);
      const u64 w64 = (u64)x[0] | ((u64)x[1] << 32);
      constexpr u32 MASK = (1u << S::B0) - 1;
#pragma unroll
      for (int w = 0; w < 8; w++) {
        const u32 lo = lut[(w64 >> (S::B0 * w)) & MASK][lane], hi = lut[(w64 >> (S::B0 * (w + 8))) & MASK][lane];
        o[w] = hmul2(lo | (hi << 16), n2);
      }
    } else {
      const u32 s2 = dup16(f2h32(S::QJL * h2f((u16)lds16(g))));
      const u32 bits = prmt(lds16(g + 2 + (c0 - HD) / 8), 0u, 0x4140u);  // bytes 0, 1 → 0, 2
#pragma unroll
      for (int w = 0; w < 8; w++) o[w] = hmul2(((bits << (15 - w)) & 0x80008000u) ^ 0xBC00BC00u, s2);
    }
  } else {
    load8h<S>(run, t, c0, o, lut);
    load8h<S>(run, t, c0 + 8, o + 4, lut);
  }
}

// 32 channels c0 .. c0+31 (c0 % 32 == 0) of a q4_0 block or a 4-bit per-token group of ≥ 32:
// the same words as two dec16 calls, with the scale and the code words loaded once.
template <class S>
__device__ __forceinline__ void dec32(u32 row, int c0, u32* o) {
  u32 x[4], s2, m2 = 0u;
  if constexpr (Fast<S>::Q4) {
    const u32 blk = row + (c0 / 32) * 18, a = blk + 2;
    s2 = dup16(lds16(blk));
    lds_run<4>(a & ~3u, 8 * (a & 3), x);
  } else {
    const int P = S::SYM ? 2 : 4;
    const u32 par = row + (c0 / S::GROUP) * P, a = row + (HD / S::GROUP) * P + c0 / 2;
    s2 = dup16(lds16(par));
    if constexpr (!S::SYM) m2 = dup16(lds16(par + 2));
    lds_run<4>(a & ~3u, 8 * (a & 3), x);
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      u32 c[2];
      if constexpr (Fast<S>::Q4) {
        const u32 y = r ? x[i] >> 4 : x[i];  // half r: low / high nibbles of the 16 code bytes
        c[0] = (y & 0x000F000Fu) | 0x64006400u;
        c[1] = ((y >> 8) & 0x000F000Fu) | 0x64006400u;
      } else {
        const u32 y = x[2 * r + i / 2] >> (8 * (i % 2));  // word 2r + i/2, nibbles i%2·2, +1
        c[0] = ((y >> 0) & 0x000F000Fu) | 0x64006400u;
        c[1] = ((y >> 4) & 0x000F000Fu) | 0x64006400u;
      }
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int w = Fast<S>::Q4 ? 8 * r + 2 * i + e : 8 * r + 4 * (i / 2) + 2 * (i % 2) + e;
        if constexpr (Fast<S>::Q4 || S::SYM) o[w] = hmul2(hsub2(c[e], Fast<S>::Q4 ? 0x64086408u : dup16(0x6400u | 8u)), s2);
        else o[w] = hfma2(hsub2(c[e], 0x64006400u), s2, m2);
      }
    }
  }
}

// Oaken: channels c0 .. c0+N−1 (N % 16 == 0) of the token row at shared address `row`: the dense
// nibbles q as middle levels (q − z)·step + (q ≥ z ? hi_inner : lo_inner) + ½·step, in chan16
// order (pairs i, i+4 of each 8); the sparse entries are corrected after the products
// (oaken_outliers). q − z is exact in f16 and the branch's threshold (plus half a step) is picked
// bitwise, so the one f16 rounding per token is that of the step: no per-token offset is
// rounded (a rounded offset biases every channel of a token alike, which q·k sums coherently).
template <class S, int N>
__device__ __forceinline__ void oaken_dense(u32 row, int c0, u32* o) {
  constexpr int SP = (HD + 63) / 64;
  int z; float step;
  oaken_grid(row, z, step);
  const u32 step2 = dup16(f2h32(step)), z2 = dup16(0x6400u | (u32)z);
  const u32 lo2 = dup16(f2h32(S::LO_INNER + 0.5f * step)), hi2 = dup16(f2h32(S::HI_INNER + 0.5f * step));
  const u32 bias = (u32)(128 - z) * 0x00010001u;  // byte 0 / 2 gets bit 7 exactly when q ≥ z
#pragma unroll
  for (int r = 0; r < N / 16; r++) {
    const u32 a = row + 8 + SP + (c0 + 16 * r) / 2;
    u32 x[2];
    lds_run<2>(a & ~3u, 8 * (a & 3), x);
#pragma unroll
    for (int k = 0; k < 2; k++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const u32 q = (x[k] >> (4 * i)) & 0x000F000Fu;
        const u32 high = prmt(q + bias, 0u, 0xAA88u);  // each half: all ones when q ≥ z
        const u32 thr = (high & hi2) | (~high & lo2);
        o[8 * r + 4 * k + i] = hfma2(hsub2(q | 0x64006400u, z2), step2, thr);
      }
  }
}

// Channels c0 .. c0+N−1 of token t: dec32 / dec16 runs when N % 16 == 0, else load8h runs.
template <class S, int N>
__device__ __forceinline__ void decrun(const u8* run, u32 run_s, int t, int c0, u32* o, const u32 (*lut)[32],
                                       const u32 (*plut)[32]) {
  if constexpr (Fast<S>::OAK) {
    oaken_dense<S, N>(run_s + (u32)t * S::BB, c0, o);
  } else if constexpr (N % 32 == 0 && (Fast<S>::Q4 || (Fast<S>::U4 && S::GROUP % 32 == 0))) {
#pragma unroll
    for (int r = 0; r < N / 32; r++) dec32<S>(run_s + (u32)t * S::BB, c0 + 32 * r, o + 16 * r);
  } else if constexpr (N % 16 == 0) {
#pragma unroll
    for (int r = 0; r < N / 16; r++) dec16<S>(run, run_s + (u32)t * S::BB, t, c0 + 16 * r, o + 8 * r, lut, plut);
  } else {
#pragma unroll
    for (int r = 0; r < N / 8; r++) load8h<S>(run, t, c0 + 8 * r, o + 4 * r, lut);
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
  } else if constexpr (S::KIND == KIND_TURBO || S::KIND == KIND_PROD) {
    // As kvq-codec turbo.rs: n = ‖x‖ in f64; unit = x / n; y = Π·unit; nearest centroid per
    // coordinate. Prod adds the residual r = Πᵀ(y − c[idx]), the QJL weight n·γ (the stored norm
    // times γ = ‖r‖, rounded once) and the signs of S·r (rot is
    // [Π; S] as the codec scales it, 2·HD rows). Sums run in index order without contraction (the
    // codec's scalar order); its vector kernels may round differently, so a code or sign at a
    // rounding boundary can differ from the CPU's (the tests accept blocks that decode with the
    // CPU's error).
    __shared__ double dscratch[1];
    const float x = rows[c];
    if (c == 0) {
      double tot = 0.0;
      for (int i = 0; i < HD; i++) tot = __dadd_rn(tot, __dmul_rn((double)rows[i], (double)rows[i]));
      dscratch[0] = sqrt(tot);
    }
    __syncthreads();
    const double n64 = dscratch[0];
    vec[c] = n64 > 0.0 ? (float)((double)x / n64) : 0.0f;
    if (c == 0) st16(out, f2h32((float)n64));
    __syncthreads();
    float y = 0.0f;
    for (int i = 0; i < HD; i++) y = __fadd_rn(y, __fmul_rn(rot[c * HD + i], vec[i]));
    const int bits = c < S::SEG0 ? S::B0 : S::B1;
    int code = 0;
    for (int i = 0; i < (1 << bits) - 1; i++) code += (c < S::SEG0 ? S::bnd0(i) : S::bnd1(i)) < y;
    codes[c] = (u8)code;
    __syncthreads();
    pack_codes(codes, S::SEG0, S::B0, out + 2);
    if (S::SEG0 < HD) pack_codes(codes + S::SEG0, HD - S::SEG0, S::B1, out + 2 + S::SEG0 * S::B0 / 8);
    if constexpr (S::KIND == KIND_PROD) {
      __shared__ float res[HD];
      res[c] = __fsub_rn(y, S::lut0(code));
      __syncthreads();
      float r = 0.0f;
      for (int j = 0; j < HD; j++) r = __fadd_rn(r, __fmul_rn(rot[j * HD + c], res[j]));
      vec[c] = r;
      __syncthreads();
      if (c == 0) {
        double tot = 0.0;
        for (int i = 0; i < HD; i++) tot = __dadd_rn(tot, __dmul_rn((double)vec[i], (double)vec[i]));
        st16(out + 2 + HD * S::B0 / 8, f2h32(__fmul_rn(h2f(ld16(out)), (float)sqrt(tot))));
      }
      float dot = 0.0f;
      for (int i = 0; i < HD; i++) dot = __fadd_rn(dot, __fmul_rn(rot[(HD + c) * HD + i], vec[i]));
      codes[HD + c] = dot >= 0.0f ? 1 : 0;
      __syncthreads();
      pack_codes(codes + HD, HD, 1, out + 4 + HD * S::B0 / 8);
    }
  } else if constexpr (S::KIND == KIND_OAKEN) {
    // As kvq-codec oaken.rs: classify by the thresholds, keep the CAP most important outliers
    // (outer by |x'| descending, then inner by distance from the inner band; ties by element),
    // demote the rest, per-token f16 scales rounded up, codes, then the fused layout.
    constexpr int SP = (HD + 63) / 64, DENSE = 8 + SP, SPARSE = DENSE + HD / 2;
    __shared__ float key[HD];
    __shared__ u8 kind[HD];  // 0 middle, 1 inner, 2 outer (before the capacity rule)
    __shared__ u8 kept[HD];
    const float x = rows[c];
    const bool outer = x <= S::LO_OUTER || x >= S::HI_OUTER;
    const bool inner = !outer && x > S::LO_INNER && x < S::HI_INNER;
    kind[c] = outer ? 2 : inner ? 1 : 0;
    key[c] = outer ? (x <= S::LO_OUTER ? __fsub_rn(S::LO_OUTER, x) : __fsub_rn(x, S::HI_OUTER))
                   : fminf(__fsub_rn(x, S::LO_INNER), __fsub_rn(S::HI_INNER, x));
    __syncthreads();
    bool keep = false;
    if (outer || inner) {
      int rank = 0;
      for (int j = 0; j < HD; j++) {
        if (kind[j] == 0) continue;
        const bool before = kind[j] > kind[c] || (kind[j] == kind[c] && (key[j] > key[c] || (key[j] == key[c] && j < c)));
        rank += before;
      }
      keep = rank < S::CAP;
    }
    kept[c] = keep;
    // Slot after the capacity rule: middle (shifted, high) or outlier (magnitude, negative).
    bool high = false, negative = false;
    float shifted = 0.0f, magnitude = 0.0f;
    if (keep) {
      negative = outer ? x <= S::LO_OUTER : x < 0.0f;
      magnitude = outer ? key[c] : fabsf(x);
    } else if (inner) {  // demoted inner value: the middle level next to its nearer threshold
      high = __fsub_rn(S::HI_INNER, x) < __fsub_rn(x, S::LO_INNER);
    } else {
      high = x >= S::HI_INNER;
      shifted = __fsub_rn(x, high ? S::HI_INNER : S::LO_INNER);
    }
    // Largest middle −x' and x', outer |x'|, inner |x| (each at least 0), rounded up to f16.
    const float f0 = !keep && shifted < 0.0f ? -shifted : 0.0f, f1 = !keep && shifted >= 0.0f ? shifted : 0.0f;
    const float f2 = keep && outer ? magnitude : 0.0f, f3 = keep && inner ? magnitude : 0.0f;
    const u16 h0 = f16_at_least((double)group_reduce<HD, true>(f0, scratch));
    const u16 h1 = f16_at_least((double)group_reduce<HD, true>(f1, scratch));
    const u16 h2 = f16_at_least((double)group_reduce<HD, true>(f2, scratch));
    const u16 h3 = f16_at_least((double)group_reduce<HD, true>(f3, scratch));
    const float lo = -h2f(h0), hi = h2f(h1);
    int z = 8;
    float step = 0.0f;
    if (__fsub_rn(hi, lo) > 0.0f) {
      z = min(max((int)roundf(__fdiv_rn(__fmul_rn(16.0f, -lo), __fsub_rn(hi, lo))), 1), 15);
      step = fmaxf(__fdiv_rn(-lo, (float)z), __fdiv_rn(hi, (float)(16 - z)));
    }
    int code;
    if (keep) {
      const float st = __fdiv_rn(h2f(outer ? h2 : h3), 15.0f);
      code = st > 0.0f ? (int)fminf(roundf(__fdiv_rn(magnitude, st)), 15.0f) : 0;
    } else {
      const float v = high ? shifted : -shifted;
      const float f = step > 0.0f ? fmaxf(floorf(__fdiv_rn(v, step)), 0.0f) : 0.0f;
      const int n = f > 15.0f ? 15 : (int)f;
      code = high ? z + min(n, 15 - z) : z - 1 - min(n, z - 1);
    }
    codes[c] = (u8)code;
    __syncthreads();
    if (c == 0) {
      st16(out, h0 ^ 0x8000u);  // the middle minimum, stored negated
      st16(out + 2, h1);
      st16(out + 4, h2);
      st16(out + 6, h3);
    }
    if (c < SP) {
      int count = 0;
      for (int j = 64 * c; j < min(HD, 64 * c + 64); j++) count += kept[j];
      out[8 + c] = (u8)count;
    }
    if (c < HD / 2) out[DENSE + c] = (u8)(codes[2 * c] | (codes[2 * c + 1] << 4));
    int before = 0, total = 0;
    for (int j = 0; j < HD; j++) { before += j < c ? kept[j] : 0; total += kept[j]; }
    if (keep) out[SPARSE + before] = (u8)((c % 64) | (outer ? 0x40 : 0) | (negative ? 0x80 : 0));
    if (c >= total && c < S::CAP) out[SPARSE + c] = 0;
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
// Fused paged decode attention on tensor cores, split over the context (version 3). grid =
// (splits, n_kv, batch), 4 warps. Each warp takes 16 tokens at a time (warp w: tokens
// start + 16·w + 64·i) and runs mma.sync.m16n8k16 (f16 in, f32 accumulate) products:
//   S (16 rows = the GQ query heads, zero-padded; 2 tiles of 8 tokens) = Q · Kᵀ over HD,
//   Oᵀ (HD rows = channels, 8 columns = query heads) += Vᵀ · Pᵀ over the step's 16 tokens.
// The second product is transposed so that its B operand (Pᵀ) is the S accumulator as it stands
// and its output has 8 columns instead of 16 padded rows: HD/16 MMAs and HD/4 accumulator
// registers per lane instead of HD/8 and HD/2. Token k (0..15) of a step is column k % 8 of
// S tile k / 8. Which channel feeds which MMA position is free (a dot product does not care
// about the order), so each lane decodes whole runs of channels: for K, lane (gid = lane/4,
// tig = lane%4) decodes channels [tig·KD/4, (tig+1)·KD/4) of tokens gid and gid + 8; for V,
// channels [gid·VD/8, (gid+1)·VD/8) of tokens 2·tig, 2·tig+1, 2·tig+8, 2·tig+9.
// Compressed layouts are copied into shared memory by cp.async, NSTAGE steps deep per warp
// (NSTAGE − 1 steps in flight while one is decoded), and the page ids are read one step ahead,
// so no global load latency sits on a warp's critical path; f16/bf16 rows are read straight from
// global memory (one 16-byte load per 8 channels). q is [batch][n_kv·GQ][KD], prepared (rotated
// for turbo keys) and pre-multiplied by softmax_scale·log2(e). Partials: acc
// [batch][heads][splits][VD] (value space, unnormalised), ml [batch][heads][splits][2]
// (running max in log2 units, sum).

#define WARPS 4

__device__ __forceinline__ void mma16816(float* d, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16-byte asynchronous copy global → shared (L2 only: the bytes are read once).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  u32 s = (u32)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Shared-memory staging of one warp step (16 tokens from page token p0, p0 % 16 == 0) of a
// compressed layout: the rows' bytes, or for channel-wise blocks (32 tokens) the block's
// per-channel parameters followed by the 16 rows' codes, so that load8h reads the copy with
// t = 0 .. 15. f16/bf16 rows are not staged. The Rust side (RoleLayout::stage_bytes) computes
// the same sizes for the dynamic shared memory.
template <class S>
struct Stage {
  enum {
    ON = S::KIND != KIND_F16 && S::KIND != KIND_BF16,
    PAR = S::KIND == KIND_UNI_CHANNEL ? HD * (S::SYM ? 2 : 4) : 0,
    ROW = S::KIND == KIND_UNI_CHANNEL ? HD * S::BITS / 8 : S::BB,
    CHUNKS = ON ? (PAR + 16 * ROW) / 16 : 0
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

extern "C" __global__ void __launch_bounds__(128, MINB) attn_partial(
    const u8* __restrict__ pool, u64 page_bytes, u64 k_head_bytes, u64 v_head_bytes, int n_kv,
    const int* __restrict__ block_table, int max_pages, const int* __restrict__ seq_lens,
    const float* __restrict__ q, float* __restrict__ part_acc, float* __restrict__ part_ml,
    int splits, int split_tokens) {
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  const int len = seq_lens[b];
  const int start = split * split_tokens;
  const int end = min(len, start + split_tokens);
  constexpr int KCH = KD / 4, VCH = VD / 8;  // channels a lane decodes per K / V token
  constexpr int MT = VD / 16;                // m-tiles of Oᵀ

  // Turbo codebooks as f16, one copy per lane (conflict-free lookups): [role][code][lane].
  // Not needed where every run of a 3-bit turbo role decodes through the pair tables.
  constexpr bool NEED_LUT = (KS::KIND == KIND_TURBO && !(Fast<KS>::T3 && KCH % 16 == 0)) ||
                            (VS::KIND == KIND_TURBO && !(Fast<VS>::T3 && VCH % 16 == 0)) ||
                            Fast<KS>::PROD || Fast<VS>::PROD;
  static_assert(!(Fast<KS>::PROD || Fast<KS>::OAK) || KCH % 16 == 0, "prod/oaken keys decode in runs of 16");
  static_assert(!(Fast<VS>::PROD || Fast<VS>::OAK) || VCH % 16 == 0, "prod/oaken values decode in runs of 16");
  __shared__ u32 lut[2][32][32];
  if constexpr (NEED_LUT) {
    for (int i = tid; i < 2 * 32 * 32; i += 128) {
      int role = i / 1024, e = (i / 32) % 32;
      float x = role == 0 ? (e < 16 ? KS::lut0(e) : KS::lut1(e - 16)) : (e < 16 ? VS::lut0(e) : VS::lut1(e - 16));
      lut[role][e][i % 32] = f2h32(x);
    }
  }
  // 3-bit turbo: pair tables [role][c1·8 + c0][lane] = {centroid c0, centroid c1} as f16.
  __shared__ u32 plut[2][64][32];
  if constexpr (Fast<KS>::T3 || Fast<VS>::T3) {
    for (int i = tid; i < 2 * 64 * 32; i += 128) {
      int role = i / 2048, e = (i / 32) % 64;
      float lo = role == 0 ? KS::lut0(e & 7) : VS::lut0(e & 7), hi = role == 0 ? KS::lut0(e >> 3) : VS::lut0(e >> 3);
      plut[role][e][i % 32] = f2h32(lo) | (f2h32(hi) << 16);
    }
  }
  // Oaken keys: the prepared query in f32 for the sparse corrections. Oaken values: each warp's
  // sparse corrections accumulate in its sacc rows (below) from the first step on.
  __shared__ float qs[Fast<KS>::OAK ? GQ : 1][Fast<KS>::OAK ? KD : 1];
  // Oaken: per-step scores corrections / value weights of [head][token] between lanes.
  __shared__ float sfix[Fast<KS>::OAK || Fast<VS>::OAK ? WARPS : 1][GQ][16];
  constexpr int HJ = (GQ + 1) / 2;  // heads per lane in the sparse corrections
  __shared__ float sacc[WARPS][GQ][VD];
  if constexpr (Fast<KS>::OAK)
    for (int i = tid; i < GQ * KD; i += 128) qs[i / KD][i % KD] = q[((u64)b * n_kv * GQ + h * GQ) * KD + i];
  if constexpr (Fast<VS>::OAK)
    for (int i = tid; i < WARPS * GQ * VD; i += 128) (&sacc[0][0][0])[i] = 0.0f;
  if constexpr (KS::KIND == KIND_TURBO || VS::KIND == KIND_TURBO || NEED_LUT || Fast<KS>::OAK || Fast<VS>::OAK)
    __syncthreads();

  // Q as the A fragment of S = Q·Kᵀ: k-chunk kc holds, for row gid, K words 2·kc and 2·kc+1
  // of the lane with this tig. Rows ≥ GQ (and rows 8..15) are zero.
  u32 qa[KD / 16][2];
  const float* qrow = q + ((u64)b * n_kv * GQ + h * GQ + min(gid, GQ - 1)) * KD + tig * KCH;
#pragma unroll
  for (int kc = 0; kc < KD / 16; kc++) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const int w = 2 * kc + half;
      u32 v = pack2f(qrow[chanrun<KS, KCH>(w, 0)], qrow[chanrun<KS, KCH>(w, 1)]);
      qa[kc][half] = gid < GQ ? v : 0u;
    }
  }

  // Oᵀ accumulators: m-tile mt = word mt of this lane's V run; [0], [1]: channel
  // chanrun(mt, 0), heads 2·tig, 2·tig+1; [2], [3]: channel chanrun(mt, 1).
  float oacc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) oacc[mt][0] = oacc[mt][1] = oacc[mt][2] = oacc[mt][3] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int* table = block_table + (u64)b * max_pages;
  const u64 v_region = (u64)n_kv * k_head_bytes + (u64)h * v_head_bytes;

  constexpr int KCK = Stage<KS>::CHUNKS, VCK = Stage<VS>::CHUNKS, SLOT = KCK + VCK;
  static_assert(NSTAGE >= 2, "at least two stages");
  extern __shared__ uint4 ring[];  // [WARPS][NSTAGE][SLOT] + 16 spare bytes (dynamic; empty without staging)
  const int first = start + 16 * warp;
  const int nsteps = first < end ? (end - first + 16 * WARPS - 1) / (16 * WARPS) : 0;
  // Starts the copy of step j (page id pid) into its ring slot.
  auto issue = [&](int j, int pid) {
    const int t = first + 16 * WARPS * j;
    const u8* pg = pool + (u64)pid * page_bytes;
    uint4* slot = ring + (warp * NSTAGE + j % NSTAGE) * SLOT;
#pragma unroll
    for (int r = 0; r < (KCK + 31) / 32; r++)
      if (lane + 32 * r < KCK) cp_async16(slot + lane + 32 * r, Stage<KS>::src(pg + (u64)h * k_head_bytes, t % PT, lane + 32 * r));
#pragma unroll
    for (int r = 0; r < (VCK + 31) / 32; r++)
      if (lane + 32 * r < VCK) cp_async16(slot + KCK + lane + 32 * r, Stage<VS>::src(pg + v_region, t % PT, lane + 32 * r));
  };
  int pnext = 0;  // staged: page id of step i + NSTAGE − 1; unstaged: of step i
  if constexpr (SLOT > 0) {
#pragma unroll
    for (int j = 0; j < NSTAGE - 1; j++) {
      if (j < nsteps) issue(j, table[(first + 16 * WARPS * j) / PT]);
      cp_commit();
    }
    if (NSTAGE - 1 < nsteps) pnext = table[(first + 16 * WARPS * (NSTAGE - 1)) / PT];
  } else {
    if (nsteps > 0) pnext = table[first / PT];
  }

  for (int i = 0; i < nsteps; i++) {
    const int t0 = first + 16 * WARPS * i;
    const u8* krun;
    const u8* vrun;
    u32 krun_s, vrun_s;
    int kp = 0, vp = 0;
    if constexpr (SLOT > 0) {
      cp_wait<NSTAGE - 2>();  // this lane's copies of step i have landed
      __syncwarp();           // ... and every lane's; slot (i − 1) % NSTAGE is free again
      if (i + NSTAGE - 1 < nsteps) issue(i + NSTAGE - 1, pnext);
      cp_commit();
      if (i + NSTAGE < nsteps) pnext = table[(first + 16 * WARPS * (i + NSTAGE)) / PT];
    }
    {
      // Unstaged: this step's page (a staged layout beside an unstaged one reads it here).
      const int pid = SLOT == 0 ? pnext : (Stage<KS>::ON && Stage<VS>::ON ? 0 : table[t0 / PT]);
      const u8* page = pool + (u64)pid * page_bytes;
      const uint4* slot = ring + (warp * NSTAGE + i % NSTAGE) * SLOT;
      krun = Stage<KS>::ON ? (const u8*)slot : page + (u64)h * k_head_bytes;
      vrun = Stage<VS>::ON ? (const u8*)(slot + KCK) : page + v_region;
      krun_s = (u32)__cvta_generic_to_shared(slot);
      vrun_s = krun_s + 16 * KCK;
      if (!Stage<KS>::ON) kp = t0 % PT;
      if (!Stage<VS>::ON) vp = t0 % PT;
      if constexpr (SLOT == 0) {
        if (i + 1 < nsteps) pnext = table[(t0 + 16 * WARPS) / PT];
      }
    }
    // Keys: tokens gid and gid + 8, channels tig·KCH ... With twice-as-long prepared queries
    // or accumulators (TurboQuant-prod) the keys are decoded 16 channels at a time next to their
    // products and the values after them, so fewer words are live at once.
    constexpr bool WIDE = KD + VD > 2 * HD;
    // Values: tokens 2·tig + (u & 1) + 8·(u / 2), channels gid·VCH ...
    u32 vw[4][VCH / 2];
    auto decode_values = [&]() {
#pragma unroll
      for (int u = 0; u < 4; u++) {
        int tv = 2 * tig + (u & 1) + 8 * (u / 2);
        int tt = vp + (t0 + tv < end ? tv : 0);
        decrun<VS, VCH>(vrun, vrun_s, tt, gid * VCH, vw[u], lut[1], plut[1]);
      }
    };
    if constexpr (!WIDE) decode_values();
    const int tk0 = kp + (t0 + gid < end ? gid : 0), tk1 = kp + (t0 + 8 + gid < end ? 8 + gid : 0);
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    constexpr int KRUN = WIDE ? 16 : KCH;
#pragma unroll
    for (int r = 0; r < KCH / KRUN; r++) {
      u32 kw[2][KRUN / 2];
      decrun<KS, KRUN>(krun, krun_s, tk0, tig * KCH + KRUN * r, kw[0], lut[0], plut[0]);
      decrun<KS, KRUN>(krun, krun_s, tk1, tig * KCH + KRUN * r, kw[1], lut[0], plut[0]);
#pragma unroll
      for (int kc = 0; kc < KRUN / 4; kc++)
#pragma unroll
        for (int tile = 0; tile < 2; tile++) {
          const u32 a[4] = {qa[KRUN / 4 * r + kc][0], 0u, qa[KRUN / 4 * r + kc][1], 0u};
          mma16816(s[tile], a, kw[tile][2 * kc], kw[tile][2 * kc + 1]);
        }
    }
    if constexpr (WIDE) decode_values();
    // Row gid (head gid) holds tokens 8·tile + 2·tig + e.
    if constexpr (Fast<KS>::OAK) {
      // Sparse key entries: lane takes token lane % 16 for heads lane / 16 + 2j; the corrections
      // reach the lanes that hold those scores through shared memory.
      const int tk = lane % 16;
      float c[HJ];
#pragma unroll
      for (int j = 0; j < HJ; j++) c[j] = 0.0f;
      oaken_outliers<KS>(krun_s + (u32)(t0 + tk < end ? tk : 0) * KS::BB, [&](int i, float d) {
#pragma unroll
        for (int j = 0; j < HJ; j++)
          if (lane / 16 + 2 * j < GQ) c[j] = fmaf(qs[lane / 16 + 2 * j][i], d, c[j]);
      });
#pragma unroll
      for (int j = 0; j < HJ; j++)
        if (lane / 16 + 2 * j < GQ) sfix[warp][lane / 16 + 2 * j][tk] = c[j];
      __syncwarp();
      if (gid < GQ) {
#pragma unroll
        for (int tile = 0; tile < 2; tile++)
#pragma unroll
          for (int e = 0; e < 2; e++) s[tile][e] += sfix[warp][gid][8 * tile + 2 * tig + e];
      }
      __syncwarp();  // sfix is reused for the values' weights below
    }
    float mx = -INFINITY;
#pragma unroll
    for (int tile = 0; tile < 2; tile++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        if (t0 + 8 * tile + 2 * tig + e >= end) s[tile][e] = -INFINITY;
        mx = fmaxf(mx, s[tile][e]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m, mx);
    const float corr = exp2f(m - mn);
    const bool grew = __any_sync(0xffffffffu, mn > m);  // else every correction is 1
    m = mn;
    float p[2][2];
#pragma unroll
    for (int tile = 0; tile < 2; tile++)
#pragma unroll
      for (int e = 0; e < 2; e++) p[tile][e] = exp2f(s[tile][e] - mn);
    l = l * corr + (p[0][0] + p[0][1]) + (p[1][0] + p[1][1]);
    // Pᵀ as the B fragment: tokens 2·tig, 2·tig+1 (tile 0) and 2·tig+8, 2·tig+9 (tile 1), head gid.
    const u32 pb0 = pack2f(p[0][0], p[0][1]), pb1 = pack2f(p[1][0], p[1][1]);
    // The Oᵀ columns of this lane are heads 2·tig and 2·tig+1: their corrections live in lanes
    // 8·tig and 8·tig + 4.
    if (grew) {
      const float c0 = __shfl_sync(0xffffffffu, corr, 8 * tig), c1 = __shfl_sync(0xffffffffu, corr, 8 * tig + 4);
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        oacc[mt][0] *= c0; oacc[mt][1] *= c1; oacc[mt][2] *= c0; oacc[mt][3] *= c1;
      }
      if constexpr (Fast<VS>::OAK)
        if (gid < GQ)
          for (int c = tig; c < VD; c += 4) sacc[warp][gid][c] *= corr;
    }
    if constexpr (Fast<VS>::OAK) {
      // Sparse value entries: O[head][i] += p·(value − middle level), in shared memory; lane
      // takes token lane % 16 for heads lane / 16 + 2j, with the weights passed through sfix.
      if (gid < GQ) {
#pragma unroll
        for (int tile = 0; tile < 2; tile++)
#pragma unroll
          for (int e = 0; e < 2; e++) sfix[warp][gid][8 * tile + 2 * tig + e] = p[tile][e];
      }
      __syncwarp();
      const int tv = lane % 16;
      float pv[HJ];
      bool any = false;
#pragma unroll
      for (int j = 0; j < HJ; j++) {
        pv[j] = lane / 16 + 2 * j < GQ ? sfix[warp][lane / 16 + 2 * j][tv] : 0.0f;
        any |= pv[j] != 0.0f;
      }
      if (any)  // a zero weight is a masked token (or an underflow): nothing to add
        oaken_outliers<VS>(vrun_s + (u32)tv * VS::BB, [&](int i, float d) {
#pragma unroll
          for (int j = 0; j < HJ; j++)
            if (pv[j] != 0.0f) atomicAdd(&sacc[warp][lane / 16 + 2 * j][i], pv[j] * d);
        });
      __syncwarp();  // sfix is rewritten next step
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      const u32 a[4] = {prmt(vw[0][mt], vw[1][mt], 0x5410u), prmt(vw[0][mt], vw[1][mt], 0x7632u),
                        prmt(vw[2][mt], vw[3][mt], 0x5410u), prmt(vw[2][mt], vw[3][mt], 0x7632u)};
      mma16816(oacc[mt], a, pb0, pb1);
    }
  }
  if constexpr (SLOT > 0) cp_wait<0>();
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  // Merge the warps of this block.
  __shared__ float sm[WARPS][GQ], sl[WARPS][GQ];
  if (gid < GQ && tig == 0) { sm[warp][gid] = m; sl[warp][gid] = l; }
  if constexpr (Fast<VS>::OAK) __syncwarp();  // the warp's sparse corrections are in sacc
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int head = 2 * tig + (e & 1);
      const int c = gid * VCH + chanrun<VS, VCH>(mt, e / 2);
      if (head < GQ) {
        if constexpr (Fast<VS>::OAK) sacc[warp][head][c] += oacc[mt][e];
        else sacc[warp][head][c] = oacc[mt][e];
      }
    }
  __syncthreads();
  for (int idx = tid; idx < GQ * VD; idx += 128) {
    int g = idx / VD, c = idx % VD;
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
    part_acc[row * VD + c] = a;
    if (c == 0) { part_ml[2 * row] = mxs; part_ml[2 * row + 1] = sum; }
  }
}


// Merges the splits: out [batch][heads][VD] = Σ_s 2^(m_s − M)·acc_s / Σ_s 2^(m_s − M)·l_s.
// grid = (heads, batch), VD threads.
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
    a += w * part_acc[(base + s) * VD + c];
    sum += w * part_ml[2 * (base + s) + 1];
  }
  out[((u64)b * heads + hq) * VD + c] = sum > 0.0f ? a / sum : 0.0f;
}

// y[r] = M·x[r] (transpose = 0; M is out_dim × in_dim row-major) or Mᵀ·x[r] (transpose = 1; M is
// in_dim × out_dim), times `factor`, for rows of in_dim (≤ 512) into rows of out_dim. grid = rows,
// out_dim threads. Prepares queries (Π, or [Π; S] for TurboQuant-prod) and maps turbo outputs back.
extern "C" __global__ void apply_matrix(const float* __restrict__ mat, const float* __restrict__ x,
                                        float* __restrict__ y, int in_dim, int out_dim, int transpose,
                                        float factor) {
  __shared__ float xs[512];
  const int r = blockIdx.x, c = threadIdx.x;
  for (int i = c; i < in_dim; i += out_dim) xs[i] = x[(u64)r * in_dim + i];
  __syncthreads();
  float a = 0.0f;
  for (int i = 0; i < in_dim; i++) a = fmaf(transpose ? mat[i * out_dim + c] : mat[c * in_dim + i], xs[i], a);
  y[(u64)r * out_dim + c] = a * factor;
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
