//! Gemma 3 (text), written from the architecture's description: scaled embeddings, RMSNorm
//! before and after attention and MLP, QK-norm, NeoX RoPE with a local base for sliding-window
//! layers and a global base for the rest, sliding-window attention on 5 of every 6 layers,
//! GeGLU MLP (tanh GELU), tied output embedding.
//!
//! K and V rows go to a [`KvCache`] and attention reads them back through [`kvq_attn::attend`]:
//! the model never sees how the cache stores them.

use crate::gguf::{Gguf, GgufError, TensorType};
use crate::matmul::QMatrix;
use crate::ModelError;
use kvq_attn::{attend, AttnParams};
use kvq_cache::{KvCache, LayerShape, SeqId};

/// Hyperparameters read from GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3Config {
    /// Decoder layers.
    pub layers: usize,
    /// Hidden width.
    pub hidden: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// MLP inner width.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Trained context length.
    pub context_length: usize,
    /// RoPE base of global layers.
    pub rope_base_global: f64,
    /// RoPE base of sliding-window layers.
    pub rope_base_local: f64,
    /// Sliding window in tokens.
    pub sliding_window: usize,
    /// Every `sliding_pattern`-th layer is global; the others use the sliding window.
    pub sliding_pattern: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Factor applied to `q·k`.
    pub attn_scale: f32,
}

impl Gemma3Config {
    /// Reads the `gemma3.*` metadata.
    pub fn from_gguf(g: &Gguf) -> Result<Self, GgufError> {
        let arch = g.get_str("general.architecture")?;
        if arch != "gemma3" {
            return Err(GgufError::Metadata {
                key: "general.architecture".into(),
                problem: format!("architecture '{arch}' is not supported (kvq runs: gemma3)"),
            });
        }
        let key = |k: &str| format!("gemma3.{k}");
        let head_dim = g.get_usize(&key("attention.key_length"))?;
        let value_dim = g.get_usize(&key("attention.value_length"))?;
        if value_dim != head_dim {
            return Err(GgufError::Metadata {
                key: key("attention.value_length"),
                problem: format!("{value_dim} differs from key_length {head_dim}"),
            });
        }
        let q_heads = g.get_usize(&key("attention.head_count"))?;
        let kv_heads = g.get_usize(&key("attention.head_count_kv"))?;
        if kv_heads == 0 || q_heads % kv_heads != 0 {
            return Err(GgufError::Metadata {
                key: key("attention.head_count_kv"),
                problem: format!("{kv_heads} KV heads do not divide {q_heads} query heads"),
            });
        }
        Ok(Self {
            layers: g.get_usize(&key("block_count"))?,
            hidden: g.get_usize(&key("embedding_length"))?,
            q_heads,
            kv_heads,
            head_dim,
            ffn: g.get_usize(&key("feed_forward_length"))?,
            vocab: g.get_array("tokenizer.ggml.tokens")?.len(),
            context_length: g.get_usize(&key("context_length"))?,
            rope_base_global: g.get_f64(&key("rope.freq_base")).unwrap_or(1_000_000.0),
            rope_base_local: g.get_f64(&key("rope.local.freq_base")).unwrap_or(10_000.0),
            sliding_window: g.get_usize(&key("attention.sliding_window"))?,
            sliding_pattern: 6,
            rms_eps: g.get_f64(&key("attention.layer_norm_rms_epsilon"))? as f32,
            attn_scale: (1.0 / (head_dim as f64).sqrt()) as f32,
        })
    }

    /// Whether layer `l` uses the sliding window.
    pub fn is_sliding(&self, l: usize) -> bool {
        !(l + 1).is_multiple_of(self.sliding_pattern)
    }

    /// The cache shape of every layer.
    pub fn layer_shapes(&self) -> Vec<LayerShape> {
        (0..self.layers)
            .map(|l| LayerShape {
                kv_heads: self.kv_heads,
                head_dim: self.head_dim,
                window: self.is_sliding(l).then_some(self.sliding_window),
            })
            .collect()
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: QMatrix,
    wk: QMatrix,
    wv: QMatrix,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    wo: QMatrix,
    post_attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: QMatrix,
    up: QMatrix,
    down: QMatrix,
    post_ffn_norm: Vec<f32>,
}

/// Gemma 3 weights, ready to run.
pub struct Gemma3 {
    /// Hyperparameters.
    pub config: Gemma3Config,
    token_embd: QMatrix,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
}

fn matrix(g: &Gguf, name: &str, rows: usize, cols: usize) -> Result<QMatrix, GgufError> {
    let t = g.tensor(name)?;
    if t.dims != [cols, rows] {
        return Err(GgufError::Tensor {
            name: name.into(),
            problem: format!("shape {:?}, expected [{cols}, {rows}]", t.dims),
        });
    }
    Ok(QMatrix {
        dtype: t.dtype,
        rows,
        cols,
        data: g.tensor_bytes(t).to_vec(),
    })
}

fn vector(g: &Gguf, name: &str, len: usize) -> Result<Vec<f32>, GgufError> {
    let t = g.tensor(name)?;
    if t.dims != [len] {
        return Err(GgufError::Tensor {
            name: name.into(),
            problem: format!("shape {:?}, expected [{len}]", t.dims),
        });
    }
    let mut out = vec![0f32; len];
    crate::quant::dequantize_row(t.dtype, g.tensor_bytes(t), &mut out);
    Ok(out)
}

impl Gemma3 {
    /// Loads the weights from an open GGUF file.
    pub fn load(g: &Gguf) -> Result<Self, GgufError> {
        let c = Gemma3Config::from_gguf(g)?;
        let (h, q, kv, f) = (
            c.hidden,
            c.q_heads * c.head_dim,
            c.kv_heads * c.head_dim,
            c.ffn,
        );
        let mut layers = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            layers.push(Layer {
                attn_norm: vector(g, &n("attn_norm"), h)?,
                wq: matrix(g, &n("attn_q"), q, h)?,
                wk: matrix(g, &n("attn_k"), kv, h)?,
                wv: matrix(g, &n("attn_v"), kv, h)?,
                q_norm: vector(g, &n("attn_q_norm"), c.head_dim)?,
                k_norm: vector(g, &n("attn_k_norm"), c.head_dim)?,
                wo: matrix(g, &n("attn_output"), h, q)?,
                post_attn_norm: vector(g, &n("post_attention_norm"), h)?,
                ffn_norm: vector(g, &n("ffn_norm"), h)?,
                gate: matrix(g, &n("ffn_gate"), f, h)?,
                up: matrix(g, &n("ffn_up"), f, h)?,
                down: matrix(g, &n("ffn_down"), h, f)?,
                post_ffn_norm: vector(g, &n("post_ffw_norm"), h)?,
            });
        }
        let token_embd = matrix(g, "token_embd.weight", c.vocab, h)?;
        if token_embd.dtype == TensorType::F32 && c.vocab * h > (1 << 28) {
            return Err(GgufError::Tensor {
                name: "token_embd.weight".into(),
                problem: "an f32 embedding this large is not supported".into(),
            });
        }
        Ok(Self {
            output_norm: vector(g, "output_norm.weight", h)?,
            token_embd,
            layers,
            config: c,
        })
    }

    /// Runs `tokens` through the model at the next positions of sequence `seq`, writing their
    /// K/V rows to `cache`. Returns the final hidden states (after the output norm) of the
    /// tokens from `hidden_from` on, `(tokens.len() − hidden_from) × hidden` values; turn them
    /// into logits with [`Gemma3::logits`].
    pub fn forward(
        &self,
        cache: &mut KvCache,
        seq: SeqId,
        tokens: &[u32],
        hidden_from: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let n = tokens.len();
        let start = cache.len(seq, 0)?;
        if start + n > c.context_length {
            return Err(ModelError::ContextOverflow {
                tokens: start + n,
                context_length: c.context_length,
            });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(ModelError::BadToken {
                id: bad,
                vocab: c.vocab,
            });
        }
        let (h, d) = (c.hidden, c.head_dim);
        let embed_scale = (h as f32).sqrt();
        let mut x = vec![0f32; n * h];
        for (row, &t) in x.chunks_exact_mut(h).zip(tokens) {
            self.token_embd.dequantize_row(t as usize, row);
            row.iter_mut().for_each(|v| *v *= embed_scale);
        }
        let positions: Vec<usize> = (start..start + n).collect();
        let (qd, kvd) = (c.q_heads * d, c.kv_heads * d);
        let (mut normed, mut q, mut k, mut v) = (
            vec![0f32; n * h],
            vec![0f32; n * qd],
            vec![0f32; n * kvd],
            vec![0f32; n * kvd],
        );
        let (mut attn, mut proj) = (vec![0f32; n * qd], vec![0f32; n * h]);
        let (mut gate, mut up) = (vec![0f32; n * c.ffn], vec![0f32; n * c.ffn]);
        for (l, layer) in self.layers.iter().enumerate() {
            rms_norm_rows(&x, &layer.attn_norm, c.rms_eps, &mut normed);
            layer.wq.matmul(&normed, n, &mut q);
            layer.wk.matmul(&normed, n, &mut k);
            layer.wv.matmul(&normed, n, &mut v);
            rms_norm_in_place(&mut q, &layer.q_norm, c.rms_eps);
            rms_norm_in_place(&mut k, &layer.k_norm, c.rms_eps);
            let base = if c.is_sliding(l) {
                c.rope_base_local
            } else {
                c.rope_base_global
            };
            rope_neox(&mut q, d, &positions, base);
            rope_neox(&mut k, d, &positions, base);
            cache.append(seq, l, &k, &v, n)?;
            let params = AttnParams {
                q_heads: c.q_heads,
                scale: c.attn_scale,
                window: c.is_sliding(l).then_some(c.sliding_window),
            };
            attend(&cache.view(seq, l)?, &q, &positions, &params, &mut attn);
            layer.wo.matmul(&attn, n, &mut proj);
            rms_norm_in_place(&mut proj, &layer.post_attn_norm, c.rms_eps);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);

            rms_norm_rows(&x, &layer.ffn_norm, c.rms_eps, &mut normed);
            layer.gate.matmul(&normed, n, &mut gate);
            layer.up.matmul(&normed, n, &mut up);
            gate.iter_mut()
                .zip(&up)
                .for_each(|(g, u)| *g = gelu_tanh(*g) * u);
            layer.down.matmul(&gate, n, &mut proj);
            rms_norm_in_place(&mut proj, &layer.post_ffn_norm, c.rms_eps);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
        }
        let mut hidden = x.split_off(hidden_from.min(n) * h);
        rms_norm_in_place(&mut hidden, &self.output_norm, c.rms_eps);
        Ok(hidden)
    }

    /// Logits (`rows × vocab`) of final hidden states (`rows × hidden`).
    pub fn logits(&self, hidden: &[f32]) -> Vec<f32> {
        let rows = hidden.len() / self.config.hidden;
        let mut out = vec![0f32; rows * self.config.vocab];
        self.token_embd.matmul(hidden, rows, &mut out);
        out
    }
}

/// `out = x / rms(x) · weight`, row by row (rows of `weight.len()`).
fn rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    out.copy_from_slice(x);
    rms_norm_in_place(out, weight, eps);
}

/// RMSNorm of every `weight.len()`-long row of `x`, in place.
fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(weight.len()) {
        let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        row.iter_mut().zip(weight).for_each(|(v, w)| *v *= inv * w);
    }
}

/// NeoX-style rotary embedding of every head of `x` (`tokens × heads × head_dim`): element `i`
/// pairs with `i + head_dim/2`, rotated by `pos · base^(−2i/head_dim)`. Angles are computed
/// per call, so no table grows with the context.
fn rope_neox(x: &mut [f32], head_dim: usize, positions: &[usize], base: f64) {
    let half = head_dim / 2;
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| base.powf(-2.0 * i as f64 / head_dim as f64))
        .collect();
    let per_token = x.len() / positions.len();
    let mut cos_sin = vec![(0f32, 0f32); half];
    for (row, &pos) in x.chunks_exact_mut(per_token).zip(positions) {
        for (cs, f) in cos_sin.iter_mut().zip(&inv_freq) {
            let (s, c) = (pos as f64 * f).sin_cos();
            *cs = (c as f32, s as f32);
        }
        for head in row.chunks_exact_mut(head_dim) {
            let (a, b) = head.split_at_mut(half);
            for ((x0, x1), &(c, s)) in a.iter_mut().zip(b.iter_mut()).zip(&cos_sin) {
                let (u, v) = (*x0, *x1);
                *x0 = u * c - v * s;
                *x1 = u * s + v * c;
            }
        }
    }
}

/// GELU with the tanh approximation (as Gemma uses): `x·(1 + tanh y)/2` with `y =
/// √(2/π)·(x + 0.044715·x³)`, computed as `x / (1 + e^(−2y))`, the same function (`(1 + tanh
/// y)/2` is the logistic of `2y`) at a third of `tanhf`'s cost, without cancellation at
/// either end.
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    x / (1.0 + (-2.0 * SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).exp())
}

#[cfg(test)]
mod tests {
    use super::gelu_tanh;

    #[test]
    fn gelu_is_the_tanh_form_to_f32_precision_in_both_tails() {
        for i in -4000..=4000 {
            let x = i as f32 / 200.0;
            let xd = f64::from(x);
            let y = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044_715 * xd.powi(3));
            // `1 + tanh y` as written loses its digits where tanh y nears −1 (also in f64):
            // there, `2·e^(2y) / (1 + e^(2y))`, the same quantity without the cancellation.
            let one_plus_tanh = if y > -1.0 {
                1.0 + y.tanh()
            } else {
                2.0 * (2.0 * y).exp() / (1.0 + (2.0 * y).exp())
            };
            let exact = 0.5 * xd * one_plus_tanh;
            let got = f64::from(gelu_tanh(x));
            assert!(
                (got - exact).abs() <= 1e-5 * exact.abs() + 1e-30,
                "gelu({x}) = {got}, exact {exact}"
            );
        }
    }
}
