//! A tiny random Gemma 3 written to a GGUF file by the test, run through kvq's model, cache and
//! attention, and compared with a plain reference forward pass written here from the
//! architecture's definition (no cache, naive attention).

use kvq_cache::{CacheOptions, KvCache, Policy};
use kvq_codec::{Calibration, KvSpec};
use kvq_model::gemma3::Gemma3;
use kvq_model::gguf::{write_gguf, Gguf, TensorData, TensorType, Value};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

const HIDDEN: usize = 64;
const LAYERS: usize = 6;
const Q_HEADS: usize = 2;
const HEAD_DIM: usize = 32;
const FFN: usize = 96;
const VOCAB: usize = 48;
const WINDOW: usize = 5;
const CONTEXT: usize = 64;

struct Weights {
    tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

impl Weights {
    fn random(seed: u64) -> Self {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut tensors = BTreeMap::new();
        let mut add = |name: String, dims: Vec<usize>, scale: f32, offset: f32| {
            let n: usize = dims.iter().product();
            let v = (0..n)
                .map(|_| offset + scale * rng.gen_range(-1.0f32..1.0))
                .collect();
            tensors.insert(name, (dims, v));
        };
        add("token_embd.weight".into(), vec![HIDDEN, VOCAB], 0.5, 0.0);
        add("output_norm.weight".into(), vec![HIDDEN], 0.2, 1.0);
        for l in 0..LAYERS {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            add(n("attn_norm"), vec![HIDDEN], 0.2, 1.0);
            add(n("attn_q"), vec![HIDDEN, Q_HEADS * HEAD_DIM], 0.3, 0.0);
            add(n("attn_k"), vec![HIDDEN, HEAD_DIM], 0.3, 0.0);
            add(n("attn_v"), vec![HIDDEN, HEAD_DIM], 0.3, 0.0);
            add(n("attn_q_norm"), vec![HEAD_DIM], 0.2, 1.0);
            add(n("attn_k_norm"), vec![HEAD_DIM], 0.2, 1.0);
            add(n("attn_output"), vec![Q_HEADS * HEAD_DIM, HIDDEN], 0.3, 0.0);
            add(n("post_attention_norm"), vec![HIDDEN], 0.2, 1.0);
            add(n("ffn_norm"), vec![HIDDEN], 0.2, 1.0);
            add(n("ffn_gate"), vec![HIDDEN, FFN], 0.3, 0.0);
            add(n("ffn_up"), vec![HIDDEN, FFN], 0.3, 0.0);
            add(n("ffn_down"), vec![FFN, HIDDEN], 0.3, 0.0);
            add(n("post_ffw_norm"), vec![HIDDEN], 0.2, 1.0);
        }
        Self { tensors }
    }

    fn get(&self, name: &str) -> &[f32] {
        &self.tensors[name].1
    }

    fn gguf_bytes(&self) -> Vec<u8> {
        let mut meta = BTreeMap::new();
        let mut put = |k: &str, v: Value| {
            meta.insert(k.to_string(), v);
        };
        put("general.architecture", Value::Str("gemma3".into()));
        put("gemma3.block_count", Value::Int(LAYERS as i64));
        put("gemma3.embedding_length", Value::Int(HIDDEN as i64));
        put("gemma3.feed_forward_length", Value::Int(FFN as i64));
        put("gemma3.attention.head_count", Value::Int(Q_HEADS as i64));
        put("gemma3.attention.head_count_kv", Value::Int(1));
        put("gemma3.attention.key_length", Value::Int(HEAD_DIM as i64));
        put("gemma3.attention.value_length", Value::Int(HEAD_DIM as i64));
        put("gemma3.attention.sliding_window", Value::Int(WINDOW as i64));
        put(
            "gemma3.attention.layer_norm_rms_epsilon",
            Value::Float(1e-6),
        );
        put("gemma3.context_length", Value::Int(CONTEXT as i64));
        put("gemma3.rope.freq_base", Value::Float(1_000_000.0));
        put("tokenizer.ggml.model", Value::Str("llama".into()));
        put(
            "tokenizer.ggml.tokens",
            Value::Array((0..VOCAB).map(|i| Value::Str(format!("t{i}"))).collect()),
        );
        put(
            "tokenizer.ggml.scores",
            Value::Array((0..VOCAB).map(|_| Value::Float(0.0)).collect()),
        );
        put(
            "tokenizer.ggml.token_type",
            Value::Array((0..VOCAB).map(|_| Value::Int(1)).collect()),
        );
        let tensors: Vec<TensorData> = self
            .tensors
            .iter()
            .map(|(name, (dims, v))| TensorData {
                name: name.clone(),
                dims: dims.clone(),
                dtype: TensorType::F32,
                bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            })
            .collect();
        write_gguf(&meta, &tensors)
    }
}

/// `y = W·x` for a GGUF matrix of dims `[cols, rows]` (row-major rows of `cols`).
fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms_norm(x: &[f32], w: &[f32]) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + 1e-6).sqrt();
    x.iter().zip(w).map(|(v, g)| v * inv * g).collect()
}

fn rope(x: &mut [f32], pos: usize, base: f64) {
    let half = x.len() / 2;
    for i in 0..half {
        let theta = pos as f64 / base.powf(2.0 * i as f64 / x.len() as f64);
        let (s, c) = (theta.sin() as f32, theta.cos() as f32);
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * c - b * s;
        x[i + half] = a * s + b * c;
    }
}

/// Logits of every position, computed plainly.
fn reference_logits(w: &Weights, tokens: &[u32]) -> Vec<Vec<f32>> {
    let n = tokens.len();
    let embd = w.get("token_embd.weight");
    let mut xs: Vec<Vec<f32>> = tokens
        .iter()
        .map(|&t| {
            embd[t as usize * HIDDEN..][..HIDDEN]
                .iter()
                .map(|v| v * (HIDDEN as f32).sqrt())
                .collect()
        })
        .collect();
    for l in 0..LAYERS {
        let g = |s: &str| w.get(&format!("blk.{l}.{s}.weight"));
        let global = (l + 1) % 6 == 0;
        let base = if global { 1_000_000.0 } else { 10_000.0 };
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (p, x) in xs.iter().enumerate() {
            let h = rms_norm(x, g("attn_norm"));
            let q = matvec(g("attn_q"), &h);
            let mut heads = Vec::new();
            for qh in q.chunks(HEAD_DIM) {
                let mut qh = rms_norm(qh, g("attn_q_norm"));
                rope(&mut qh, p, base);
                heads.push(qh);
            }
            qs.push(heads);
            let mut k = rms_norm(&matvec(g("attn_k"), &h), g("attn_k_norm"));
            rope(&mut k, p, base);
            ks.push(k);
            vs.push(matvec(g("attn_v"), &h));
        }
        for p in 0..n {
            let mut attn = Vec::new();
            for q in &qs[p] {
                let visible: Vec<usize> = (0..=p).filter(|&j| global || p - j < WINDOW).collect();
                let scores: Vec<f32> = visible
                    .iter()
                    .map(|&j| {
                        q.iter().zip(&ks[j]).map(|(a, b)| a * b).sum::<f32>()
                            / (HEAD_DIM as f32).sqrt()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f32 = e.iter().sum();
                let mut o = vec![0f32; HEAD_DIM];
                for (wgt, &j) in e.iter().zip(&visible) {
                    for (oi, vi) in o.iter_mut().zip(&vs[j]) {
                        *oi += wgt / z * vi;
                    }
                }
                attn.extend(o);
            }
            let o = rms_norm(&matvec(g("attn_output"), &attn), g("post_attention_norm"));
            let x = &mut xs[p];
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let h = rms_norm(x, g("ffn_norm"));
            let gate = matvec(g("ffn_gate"), &h);
            let up = matvec(g("ffn_up"), &h);
            let act: Vec<f32> = gate
                .iter()
                .zip(&up)
                .map(|(&a, &u)| {
                    0.5 * a * (1.0 + (0.797_884_6 * (a + 0.044715 * a * a * a)).tanh()) * u
                })
                .collect();
            let d = rms_norm(&matvec(g("ffn_down"), &act), g("post_ffw_norm"));
            x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        }
    }
    xs.iter()
        .map(|x| matvec(embd, &rms_norm(x, w.get("output_norm.weight"))))
        .collect()
}

fn load(w: &Weights) -> (tempfile_path::TempPath, Gemma3) {
    let path = tempfile_path::TempPath::new("tiny-gemma3.gguf");
    std::fs::write(&path.0, w.gguf_bytes()).unwrap();
    let g = Gguf::open(&path.0).unwrap();
    let model = Gemma3::load(&g).unwrap();
    (path, model)
}

mod tempfile_path {
    /// A file path in the system temp dir, removed on drop.
    pub struct TempPath(pub std::path::PathBuf);
    impl TempPath {
        pub fn new(name: &str) -> Self {
            let unique = format!(
                "kvq-{}-{:?}-{name}",
                std::process::id(),
                std::thread::current().id()
            );
            Self(std::env::temp_dir().join(unique.replace(['(', ')'], "")))
        }
    }
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

fn cache_for(model: &Gemma3, kv: &str, options: CacheOptions) -> KvCache {
    let c = &model.config;
    let policy = Policy::uniform(KvSpec::parse(kv).unwrap(), c.layers);
    let cal = vec![(Calibration::default(), Calibration::default()); c.layers];
    KvCache::new(&c.layer_shapes(), &policy, &cal, options, CONTEXT, 2).unwrap()
}

fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    let scale = b.iter().map(|v| v.abs()).fold(0f32, f32::max);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{what}: element {i}: {x} vs {y} (scale {scale})"
        );
    }
}

fn small_pages() -> CacheOptions {
    CacheOptions {
        page_tokens: 4,
        max_append_tokens: 32,
        ..CacheOptions::default()
    }
}

#[test]
fn prefill_and_decode_match_the_plain_reference_including_sliding_windows() {
    let w = Weights::random(1);
    let (_path, model) = load(&w);
    let tokens: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % VOCAB as u32).collect();
    let expected = reference_logits(&w, &tokens);

    // One prefill of every token, f32 cache.
    let mut cache = cache_for(&model, "f32", small_pages());
    let seq = cache.add_sequence();
    let hidden = model.forward(&mut cache, seq, &tokens, 0).unwrap();
    let logits = model.logits(&hidden);
    for (p, exp) in expected.iter().enumerate() {
        assert_close(
            &logits[p * VOCAB..(p + 1) * VOCAB],
            exp,
            2e-4,
            &format!("prefill position {p}"),
        );
    }

    // Prefill of 7, then token by token: the same logits.
    let mut cache = cache_for(&model, "f32", small_pages());
    let seq = cache.add_sequence();
    model.forward(&mut cache, seq, &tokens[..7], 0).unwrap();
    for p in 7..tokens.len() {
        let hidden = model
            .forward(&mut cache, seq, &tokens[p..p + 1], 0)
            .unwrap();
        assert_close(
            &model.logits(&hidden),
            &expected[p],
            2e-4,
            &format!("decode position {p}"),
        );
    }
    // Sliding-window layers released the pages nobody can see: with windows of 5 tokens and
    // pages of 4, a window layer holds at most 3 pages, a global layer all 5.
    let (used, _) = cache.page_usage();
    assert!(used <= 5 * 3 + 5, "pages in use: {used}");
}

#[test]
fn f16_cache_stays_close_and_hot_window_is_exact() {
    let w = Weights::random(2);
    let (_path, model) = load(&w);
    let tokens: Vec<u32> = (0..16).map(|i| (i * 5 + 1) % VOCAB as u32).collect();
    let expected = reference_logits(&w, &tokens);
    let run = |kv: &str, options| {
        let mut cache = cache_for(&model, kv, options);
        let seq = cache.add_sequence();
        model.logits(&model.forward(&mut cache, seq, &tokens, 15).unwrap())
    };
    assert_close(&run("f16", small_pages()), &expected[15], 1e-2, "f16 cache");
    // A q4_0 cache whose hot window covers the whole sequence never quantizes anything.
    let hot = CacheOptions {
        hot_window: 16,
        ..small_pages()
    };
    let q4 = run("q4_0", hot);
    assert_close(
        &q4,
        &run("f16", small_pages()),
        1e-5,
        "q4_0 with a full hot window",
    );
    // Without the window it differs.
    let cold = run("q4_0", small_pages());
    assert!(cold.iter().zip(&q4).any(|(a, b)| (a - b).abs() > 1e-4));
}

#[test]
fn context_overflow_and_bad_tokens_are_errors_that_change_nothing() {
    let w = Weights::random(3);
    let (_path, model) = load(&w);
    let mut cache = cache_for(&model, "f16", small_pages());
    let seq = cache.add_sequence();
    let err = model
        .forward(&mut cache, seq, &[1, 2, VOCAB as u32], 0)
        .unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    assert_eq!(cache.len(seq, 0).unwrap(), 0);
    let long = vec![1u32; CONTEXT + 1];
    let err = model.forward(&mut cache, seq, &long, 0).unwrap_err();
    assert!(err.to_string().contains("context length"), "{err}");
    assert_eq!(cache.len(seq, 0).unwrap(), 0);
}
