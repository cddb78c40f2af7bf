//! GPU against CPU: kernels compile for every scheme with a kernel; the GPU's encoded blocks
//! decode on the CPU codec; GPU attention equals `kvq_attn::attend` on the same cache.
//! Without CUDA (CI) each test prints why it skips and returns.

use kvq_attn::{attend, AttnParams};
use kvq_cache::{CacheOptions, KvCache, LayerShape, Policy};
use kvq_codec::{build_codec, Calibration, KvSpec, OakenThresholds, Role, SchemeKind};
use kvq_gpu::{compile, layouts, libraries, prelude, CacheShape, Gpu, PagedKernels, Tuning};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Every scheme that has GPU kernels.
const SCHEMES: &[&str] = &[
    "f16",
    "bf16",
    "q8_0",
    "q4_0",
    "int8",
    "int4-g32",
    "int4-g64",
    "int4-g128",
    "int2-g64",
    "fp8",
    "kivi4",
    "kivi2",
    "turbo4",
    "turbo3.5",
    "turbo3",
    "turbo2.5",
    "turbo2",
    "turbo2-prod",
    "turbo3-prod",
    "turbo4-prod",
    "oaken",
];

const HD: usize = 128;
const KV_HEADS: usize = 8;
const Q_HEADS: usize = 32;
const PAGE: usize = 64;

fn gpu() -> Option<Gpu> {
    match Gpu::open() {
        Ok(g) => Some(g),
        Err(why) => {
            eprintln!("SKIP: no GPU for this test ({why})");
            None
        }
    }
}

fn shape() -> CacheShape {
    CacheShape {
        kv_heads: KV_HEADS,
        q_heads: Q_HEADS,
        head_dim: HD,
        page_tokens: PAGE,
    }
}

/// Rows as the tests draw them: uniform in [-1, 1), every 7th value 4× larger (outliers).
fn sample_value(rng: &mut impl Rng, i: usize) -> f32 {
    rng.gen_range(-1.0..1.0f32) * if i % 7 == 3 { 4.0 } else { 1.0 }
}

/// The calibration a scheme needs: Oaken's thresholds profiled on rows like the tests' (so all
/// three groups and the capacity rule occur); nothing for the others.
fn calibration(kind: SchemeKind) -> Calibration {
    if kind != SchemeKind::Oaken {
        return Calibration::default();
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut samples: Vec<f32> = (0..64 * HD).map(|i| sample_value(&mut rng, i)).collect();
    Calibration {
        oaken_thresholds: Some(OakenThresholds::from_samples(&mut samples)),
        ..Calibration::default()
    }
}

fn codecs(
    name: &str,
) -> (
    SchemeKind,
    Box<dyn kvq_codec::Codec>,
    Box<dyn kvq_codec::Codec>,
) {
    let kind = SchemeKind::parse(name).unwrap();
    let cal = calibration(kind);
    let k = build_codec(kind, Role::Key, HD, &cal, 17).unwrap();
    let v = build_codec(kind, Role::Value, HD, &cal, 18).unwrap();
    (kind, k, v)
}

#[test]
fn kernels_compile_for_every_scheme() {
    if !libraries().nvrtc {
        eprintln!("SKIP: libnvrtc not found");
        return;
    }
    for name in SCHEMES {
        let (kind, k, v) = codecs(name);
        let (kl, vl) = layouts(kind, kind, k.as_ref(), v.as_ref()).unwrap();
        compile(&prelude(shape(), &kl, &vl)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn gpu_encoded_blocks_decode_on_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed ^ std::process::id() as u64);
    let (batch, n_tok) = (2usize, 256usize);
    let pages_per_seq = n_tok / PAGE;
    let mut failures = Vec::new();
    for name in SCHEMES {
        let (kind, kc, vc) = codecs(name);
        let (kl, vl) = layouts(kind, kind, kc.as_ref(), vc.as_ref()).unwrap();
        let kernels = PagedKernels::new(&gpu, shape(), kl, vl, Tuning::default()).unwrap();
        let mut table: Vec<i32> = (0..(batch * pages_per_seq) as i32).collect();
        table.shuffle(&mut rng);
        let n = batch * n_tok * KV_HEADS * HD;
        let k: Vec<f32> = (0..n).map(|i| sample_value(&mut rng, i)).collect();
        let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0f32)).collect();
        let s = gpu.stream();
        let mut pool = s
            .clone_htod(&vec![0xA5u8; table.len() * kernels.page_bytes()])
            .unwrap();
        let dtable = s.clone_htod(&table).unwrap();
        let (dk, dv) = (s.clone_htod(&k).unwrap(), s.clone_htod(&v).unwrap());
        kernels
            .encode(
                &gpu,
                &mut pool,
                &dtable,
                pages_per_seq,
                batch,
                0,
                n_tok,
                &dk,
                &dv,
            )
            .unwrap();
        let bytes = s.clone_dtoh(&pool).unwrap();
        for (role, codec, rows, region, head_bytes) in [
            ("K", kc.as_ref(), &k, 0, kernels.k_head_bytes()),
            (
                "V",
                vc.as_ref(),
                &v,
                KV_HEADS * kernels.k_head_bytes(),
                kernels.v_head_bytes(),
            ),
        ] {
            let (bt, bb) = (codec.block_tokens(), codec.block_bytes());
            let (mut same, mut blocks) = (0usize, 0usize);
            let mut first_diff = None;
            let (mut gpu_dec, mut cpu_dec, mut orig) = (Vec::new(), Vec::new(), Vec::new());
            for b in 0..batch {
                for h in 0..KV_HEADS {
                    for blk in 0..n_tok / bt {
                        let pos = blk * bt;
                        let page = table[b * pages_per_seq + pos / PAGE] as usize;
                        let at = page * kernels.page_bytes()
                            + region
                            + h * head_bytes
                            + (pos % PAGE) / bt * bb;
                        let gpu_block = &bytes[at..at + bb];
                        let block_rows: Vec<f32> = (0..bt)
                            .flat_map(|t| {
                                let r = ((b * n_tok + pos + t) * KV_HEADS + h) * HD;
                                rows[r..r + HD].to_vec()
                            })
                            .collect();
                        let mut cpu_block = vec![0u8; bb];
                        codec.encode(&block_rows, &mut cpu_block).unwrap();
                        same += usize::from(cpu_block == gpu_block);
                        if first_diff.is_none() && cpu_block != gpu_block {
                            let i = (0..bb).find(|&i| cpu_block[i] != gpu_block[i]).unwrap();
                            first_diff = Some((b, h, pos, i, cpu_block[i], gpu_block[i]));
                        }
                        blocks += 1;
                        let mut g = vec![0f32; bt * HD];
                        let mut c = vec![0f32; bt * HD];
                        codec.decode(gpu_block, &mut g);
                        codec.decode(&cpu_block, &mut c);
                        gpu_dec.extend(g);
                        cpu_dec.extend(c);
                        orig.extend(block_rows);
                    }
                }
            }
            let (eg, ec) = (rel(&gpu_dec, &orig), rel(&cpu_dec, &orig));
            println!(
                "{name:<10} {role}: {same}/{blocks} blocks byte-identical (first difference: {first_diff:?}); decode error GPU {eg:.3e}, CPU {ec:.3e}"
            );
            if eg > ec * 1.02 + 1e-7 {
                failures.push(format!(
                    "{name} {role}: GPU blocks decode with error {eg} vs CPU {ec}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn gpu_attention_equals_cpu_attention() {
    let Some(gpu) = gpu() else { return };
    // The CPU reference on its float kernels: the integer ones round queries and weights to i8
    // (kvq_codec::levels), ~1e-2 away from exact; the device computes in floats.
    kvq_codec::levels::set_enabled(false);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xa77e ^ std::process::id() as u64);
    let lens = [1024usize, 672, 96];
    let max_ctx = lens[0];
    for name in SCHEMES {
        let spec = KvSpec::parse(name).unwrap();
        let layer = LayerShape {
            kv_heads: KV_HEADS,
            head_dim: HD,
            window: None,
        };
        let options = CacheOptions {
            page_tokens: PAGE,
            hot_window: 0,
            sink_tokens: 0,
            max_append_tokens: 1024,
            seed: 99,
            // The device reads pages as rows.
            interleave: false,
        };
        let cal = (calibration(spec.k), calibration(spec.v));
        let mut cache = KvCache::new(
            &[layer],
            &Policy::uniform(spec, 1),
            &[cal],
            options,
            max_ctx,
            lens.len(),
        )
        .unwrap();
        let seqs: Vec<_> = lens
            .iter()
            .map(|&len| {
                let seq = cache.add_sequence();
                let n = len * KV_HEADS * HD;
                let k: Vec<f32> = (0..n).map(|i| sample_value(&mut rng, i)).collect();
                let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0f32)).collect();
                cache.append(seq, 0, &k, &v, len).unwrap();
                seq
            })
            .collect();
        let q: Vec<f32> = (0..lens.len() * Q_HEADS * HD)
            .map(|_| rng.gen_range(-3.0..3.0f32))
            .collect();
        let params = AttnParams {
            q_heads: Q_HEADS,
            scale: 1.0 / (HD as f32).sqrt(),
            window: None,
        };

        // Lay the CPU cache's pages out on the device, page by page, and attend on the CPU.
        let views: Vec<_> = seqs.iter().map(|&s| cache.view(s, 0).unwrap()).collect();
        let (kl, vl) = layouts(spec.k, spec.v, views[0].k_codec, views[0].v_codec).unwrap();
        // Page geometry does not depend on the tuning.
        let kernels =
            PagedKernels::new(&gpu, shape(), kl.clone(), vl.clone(), Tuning::default()).unwrap();
        let max_pages = max_ctx.div_ceil(PAGE);
        let mut host_pool = Vec::new();
        let mut table = vec![0i32; lens.len() * max_pages];
        let mut expected = vec![0f32; q.len()];
        for (b, view) in views.iter().enumerate() {
            assert_eq!(view.len, lens[b]);
            for (i, span) in view.spans.iter().enumerate() {
                assert!(
                    span.compressed() && span.first_pos == i * PAGE,
                    "{name}: expected whole compressed pages"
                );
                let mut page = vec![0u8; kernels.page_bytes()];
                for h in 0..KV_HEADS {
                    let k = span.keys(h);
                    page[h * kernels.k_head_bytes()..][..k.len()].copy_from_slice(k);
                    let v = span.values(h);
                    page[KV_HEADS * kernels.k_head_bytes() + h * kernels.v_head_bytes()..]
                        [..v.len()]
                        .copy_from_slice(v);
                }
                table[b * max_pages + i] = (host_pool.len() / kernels.page_bytes()) as i32;
                host_pool.extend(page);
            }
            let qs = &q[b * Q_HEADS * HD..][..Q_HEADS * HD];
            attend(
                view,
                qs,
                &[lens[b] - 1],
                &params,
                &mut expected[b * Q_HEADS * HD..][..Q_HEADS * HD],
            );
        }
        let s = gpu.stream();
        let pool = s.clone_htod(&host_pool).unwrap();
        let dtable = s.clone_htod(&table).unwrap();
        let dlens = s
            .clone_htod(&lens.iter().map(|&l| l as i32).collect::<Vec<_>>())
            .unwrap();
        let dq = s.clone_htod(&q).unwrap();
        // Both occupancy targets (ring depths and register caps) and a finer split.
        for tuning in [
            Tuning::default(),
            Tuning {
                blocks_per_sm: 16,
                min_blocks: 4,
            },
        ] {
            let sms = gpu.info().unwrap().multiprocessors as usize;
            let kernels = PagedKernels::new(&gpu, shape(), kl.clone(), vl.clone(), tuning).unwrap();
            let mut scratch = kernels.scratch(&gpu, lens.len(), max_ctx, sms).unwrap();
            let mut out = s.clone_htod(&vec![f32::NAN; q.len()]).unwrap();
            kernels
                .attend(
                    &gpu,
                    &pool,
                    &dtable,
                    max_pages,
                    &dlens,
                    lens.len(),
                    &dq,
                    params.scale,
                    &mut scratch,
                    &mut out,
                )
                .unwrap();
            let got = s.clone_dtoh(&out).unwrap();
            let err = rel(&got, &expected);
            println!(
                "{name:<10} attention ({}): relative error {err:.3e}",
                tuning.label()
            );
            assert!(
                got.iter().all(|x| x.is_finite()),
                "{name}: unwritten or non-finite output"
            );
            assert!(
                err < 1e-3,
                "{name}: GPU attention differs from CPU by {err}"
            );
        }
    }
}
