//! Offline profiling (`kvq calibrate`): the model runs over chunks of calibration text with an
//! f32 cache, the stored K and V rows are read back per layer, and per layer and role this
//! records Oaken's four thresholds (quantiles 2/47/53/98% of the layer's values, averaged over
//! samples as in Oaken's `oaken_preprocess_activation.py`), per-channel mean, RMS and absolute
//! maximum, FP8 E4M3 scales (per tensor and per KV head) and the channels ranked by RMS (TurboQuant's
//! outlier channels). Keys are read after RoPE, as the cache stores them.
//!
//! Profiles written before the channel means were recorded still read (same version, the
//! checksum covers the content as stored): their `channel_mean` is empty, and codecs that need
//! means (channel normalization) report it missing.

use crate::file::{self, FileError};
use crate::identity::ModelIdentity;
use kvq_cache::{CacheOptions, KvCache, Policy};
use kvq_codec::{Calibration, KvSpec, OakenThresholds};
use kvq_model::gemma3::Gemma3;
use kvq_model::ModelError;
use serde::{Deserialize, Serialize};

/// Format name of profile files.
pub const FORMAT: &str = "kvq-profile";
/// Version of profile files this build writes and reads.
pub const VERSION: u64 = 1;
/// Sampling stops once no threshold moves by more than this share between two samples.
pub const CONVERGENCE: f64 = 1e-3;
/// Largest finite FP8 E4M3 value: a scale of `absmax / 448` uses the whole range.
const FP8_E4M3_MAX: f32 = 448.0;

/// Statistics of one layer and role.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoleProfile {
    /// Oaken thresholds `[lo_outer, lo_inner, hi_inner, hi_outer]`, mean over samples.
    pub oaken: [f32; 4],
    /// RMS of each channel (`head_dim`), over every token and KV head.
    pub channel_rms: Vec<f32>,
    /// Largest absolute value of each channel.
    pub channel_absmax: Vec<f32>,
    /// Mean of each channel (`head_dim`), over every token and KV head; empty in profiles
    /// written before it was recorded.
    #[serde(default)]
    pub channel_mean: Vec<f32>,
    /// FP8 E4M3 scale of the whole tensor (real value per FP8 unit: absmax / 448).
    pub fp8_scale: f32,
    /// FP8 E4M3 scale of each KV head.
    pub fp8_head_scales: Vec<f32>,
    /// The `head_dim / 2` channels of largest RMS, largest first.
    pub outlier_channels: Vec<usize>,
}

/// The K and V statistics of one layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerProfile {
    /// Keys (after RoPE).
    pub k: RoleProfile,
    /// Values.
    pub v: RoleProfile,
}

/// A calibration profile: what `kvq calibrate` writes and `--profile` reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Tokens per sample.
    pub ctx: usize,
    /// Samples (chunks) profiled.
    pub samples: usize,
    /// Whether sampling stopped because the thresholds converged.
    pub converged: bool,
    /// One entry per layer.
    pub layers: Vec<LayerProfile>,
}

impl RoleProfile {
    /// The codec calibration of this layer and role.
    pub fn calibration(&self) -> Calibration {
        let [lo_outer, lo_inner, hi_inner, hi_outer] = self.oaken;
        let floor = self.channel_rms.iter().copied().fold(0f32, f32::max) * 1e-6;
        Calibration {
            oaken_thresholds: Some(OakenThresholds {
                lo_outer,
                lo_inner,
                hi_inner,
                hi_outer,
            }),
            fp8_scale: Some(self.fp8_scale),
            channel_scales: Some(
                self.channel_rms
                    .iter()
                    .map(|&r| r.max(floor).max(f32::MIN_POSITIVE))
                    .collect(),
            ),
            outlier_channels: Some(self.outlier_channels.clone()),
            channel_means: (!self.channel_mean.is_empty()).then(|| self.channel_mean.clone()),
            channel_norm: false,
        }
    }

    fn check(&self, kv_heads: usize, head_dim: usize) -> Result<(), String> {
        let [a, b, c, d] = self.oaken;
        if !(a < b && b < c && c < d) {
            return Err(format!(
                "Oaken thresholds {:?} are not increasing",
                self.oaken
            ));
        }
        let positive = |v: f32| v.is_finite() && v > 0.0;
        if self.channel_rms.len() != head_dim || self.channel_absmax.len() != head_dim {
            return Err(format!("channel statistics are not {head_dim} long"));
        }
        if !self.channel_mean.is_empty() && self.channel_mean.len() != head_dim {
            return Err(format!("channel means are not {head_dim} long"));
        }
        if self.channel_mean.iter().any(|v| !v.is_finite()) {
            return Err("channel means must be finite".into());
        }
        if self.fp8_head_scales.len() != kv_heads {
            return Err(format!("FP8 head scales are not {kv_heads} long"));
        }
        if !positive(self.fp8_scale) || !self.fp8_head_scales.iter().all(|&s| positive(s)) {
            return Err("FP8 scales must be finite and positive".into());
        }
        if self.channel_rms.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return Err("channel RMS must be finite and non-negative".into());
        }
        let mut seen = vec![false; head_dim];
        for &c in &self.outlier_channels {
            if c >= head_dim || std::mem::replace(&mut seen[c], true) {
                return Err(format!("outlier channel {c} out of range or repeated"));
            }
        }
        Ok(())
    }
}

impl Profile {
    /// The file text of this profile for `model`.
    pub fn to_file(&self, model: &ModelIdentity) -> String {
        file::write(FORMAT, VERSION, model, self)
    }

    /// Reads a profile file for `model`, refusing one of another model or version or a
    /// corrupt one.
    pub fn from_file(text: &str, model: &ModelIdentity) -> Result<Self, FileError> {
        file::read(text, FORMAT, VERSION, model, |p: &Profile| {
            if p.layers.len() != model.layers {
                return Err(format!(
                    "{} layers, the model has {}",
                    p.layers.len(),
                    model.layers
                ));
            }
            for (l, layer) in p.layers.iter().enumerate() {
                for (role, r) in [("K", &layer.k), ("V", &layer.v)] {
                    r.check(model.kv_heads, model.head_dim)
                        .map_err(|e| format!("layer {l} {role}: {e}"))?;
                }
            }
            Ok(())
        })
    }

    /// Per-layer (K, V) codec calibration.
    pub fn calibration(&self) -> Vec<(Calibration, Calibration)> {
        self.layers
            .iter()
            .map(|l| (l.k.calibration(), l.v.calibration()))
            .collect()
    }
}

/// One layer's K and V rows, each `kv_heads` blocks of `tokens × head_dim` values.
pub type LayerRows = (Vec<f32>, Vec<f32>);

/// Running sums of one layer and role.
#[derive(Clone, Debug)]
struct RoleStats {
    thresholds: [f64; 4],
    sum: Vec<f64>,
    sum_sq: Vec<f64>,
    count: usize,
    channel_absmax: Vec<f32>,
    head_absmax: Vec<f32>,
}

impl RoleStats {
    fn new(kv_heads: usize, head_dim: usize) -> Self {
        Self {
            thresholds: [0.0; 4],
            sum: vec![0.0; head_dim],
            sum_sq: vec![0.0; head_dim],
            count: 0,
            channel_absmax: vec![0.0; head_dim],
            head_absmax: vec![0.0; kv_heads],
        }
    }

    /// Adds one sample: `rows` holds `kv_heads` blocks of `tokens × head_dim` values.
    fn add(&mut self, rows: &[f32]) {
        let (heads, d) = (self.head_absmax.len(), self.sum_sq.len());
        for (h, head_rows) in rows.chunks_exact(rows.len() / heads).enumerate() {
            for row in head_rows.chunks_exact(d) {
                for (c, &x) in row.iter().enumerate() {
                    self.sum[c] += f64::from(x);
                    self.sum_sq[c] += f64::from(x) * f64::from(x);
                    self.channel_absmax[c] = self.channel_absmax[c].max(x.abs());
                    self.head_absmax[h] = self.head_absmax[h].max(x.abs());
                }
            }
        }
        self.count += rows.len() / d;
        let t = OakenThresholds::from_samples(&mut rows.to_vec());
        for (sum, x) in self
            .thresholds
            .iter_mut()
            .zip([t.lo_outer, t.lo_inner, t.hi_inner, t.hi_outer])
        {
            *sum += f64::from(x);
        }
    }

    fn profile(&self, samples: usize) -> RoleProfile {
        let count = self.count.max(1) as f64;
        let rms: Vec<f32> = self
            .sum_sq
            .iter()
            .map(|s| (s / count).sqrt() as f32)
            .collect();
        let mut ranked: Vec<usize> = (0..rms.len()).collect();
        ranked.sort_by(|&a, &b| rms[b].total_cmp(&rms[a]).then(a.cmp(&b)));
        ranked.truncate(rms.len() / 2);
        let fp8 = |absmax: f32| (absmax / FP8_E4M3_MAX).max(f32::MIN_POSITIVE);
        RoleProfile {
            oaken: self.thresholds.map(|s| (s / samples as f64) as f32),
            channel_rms: rms,
            channel_absmax: self.channel_absmax.clone(),
            channel_mean: self.sum.iter().map(|s| (s / count) as f32).collect(),
            fp8_scale: fp8(self.head_absmax.iter().copied().fold(0.0, f32::max)),
            fp8_head_scales: self.head_absmax.iter().map(|&a| fp8(a)).collect(),
            outlier_channels: ranked,
        }
    }
}

/// Accumulates samples of every layer's K and V rows into a [`Profile`].
#[derive(Clone, Debug)]
pub struct Profiler {
    ctx: usize,
    samples: usize,
    layers: Vec<[RoleStats; 2]>,
}

impl Profiler {
    /// An empty profiler for `layers` layers of `kv_heads × head_dim` and samples of `ctx` tokens.
    pub fn new(layers: usize, kv_heads: usize, head_dim: usize, ctx: usize) -> Self {
        let stats = RoleStats::new(kv_heads, head_dim);
        Self {
            ctx,
            samples: 0,
            layers: vec![[stats.clone(), stats]; layers],
        }
    }

    /// Adds one sample: per layer, the K and V rows, each `kv_heads` blocks of
    /// `tokens × head_dim` values.
    pub fn add_sample(&mut self, rows: &[LayerRows]) {
        assert_eq!(rows.len(), self.layers.len(), "one (K, V) pair per layer");
        for ([k, v], (kr, vr)) in self.layers.iter_mut().zip(rows) {
            k.add(kr);
            v.add(vr);
        }
        self.samples += 1;
    }

    /// Samples added so far.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// The profile of the samples so far; `converged` says why sampling stopped.
    pub fn profile(&self, converged: bool) -> Profile {
        Profile {
            ctx: self.ctx,
            samples: self.samples,
            converged,
            layers: self
                .layers
                .iter()
                .map(|[k, v]| LayerProfile {
                    k: k.profile(self.samples),
                    v: v.profile(self.samples),
                })
                .collect(),
        }
    }
}

/// The largest change of any threshold between two profiles of the same model, relative to
/// its layer and role's outer spread `hi_outer − lo_outer` in `before` (so that thresholds
/// near zero, such as the inner ones, are not divided by almost nothing).
pub fn threshold_change(before: &Profile, after: &Profile) -> f64 {
    let roles = |p: &Profile| -> Vec<[f32; 4]> {
        p.layers
            .iter()
            .flat_map(|l| [l.k.oaken, l.v.oaken])
            .collect()
    };
    roles(before)
        .iter()
        .zip(roles(after))
        .flat_map(|(b, a)| {
            let spread = f64::from(b[3] - b[0]).max(f64::MIN_POSITIVE);
            (0..4).map(move |i| f64::from(a[i] - b[i]).abs() / spread)
        })
        .fold(0.0, f64::max)
}

/// Whether sampling may stop: at least two samples and no threshold moved by
/// [`CONVERGENCE`] or more with the last one.
pub fn converged(before: &Profile, after: &Profile) -> bool {
    after.samples >= 2 && threshold_change(before, after) < CONVERGENCE
}

/// Reads every layer's K and V rows of `seq` back from `cache` (decoded, per KV head).
fn stored_rows(cache: &KvCache, seq: kvq_cache::SeqId) -> Result<Vec<LayerRows>, ModelError> {
    (0..cache.layers())
        .map(|layer| {
            let view = cache.view(seq, layer)?;
            let mut k = Vec::new();
            let mut v = Vec::new();
            for head in 0..view.kv_heads {
                for span in &view.spans {
                    let (ks, vs) = view.decode_span(span, head);
                    k.extend(ks);
                    v.extend(vs);
                }
            }
            Ok((k, v))
        })
        .collect()
}

/// Profiles `model` over consecutive chunks of `ctx` tokens of `tokens` (the first of each
/// replaced by `bos`), until the thresholds converge or after `max_samples` chunks.
/// `on_sample` gets the samples done and the last threshold change.
pub fn calibrate(
    model: &Gemma3,
    tokens: &[u32],
    bos: u32,
    ctx: usize,
    max_samples: usize,
    mut on_sample: impl FnMut(usize, f64),
) -> Result<Profile, ModelError> {
    let c = &model.config;
    let policy = Policy::uniform(KvSpec::parse("f32").expect("f32 is a scheme"), c.layers);
    let calibration = vec![Default::default(); c.layers];
    let options = CacheOptions {
        max_append_tokens: ctx,
        ..CacheOptions::default()
    };
    let mut cache = KvCache::new(&c.layer_shapes(), &policy, &calibration, options, ctx, 1)?;
    let mut profiler = Profiler::new(c.layers, c.kv_heads, c.head_dim, ctx);
    let mut last: Option<Profile> = None;
    for chunk in tokens.chunks_exact(ctx).take(max_samples) {
        let mut batch = chunk.to_vec();
        batch[0] = bos;
        let seq = cache.add_sequence();
        model.forward(&mut cache, seq, &batch, ctx - 1)?;
        profiler.add_sample(&stored_rows(&cache, seq)?);
        cache.release(seq)?;
        let now = profiler.profile(false);
        let change = last
            .as_ref()
            .map_or(f64::INFINITY, |b| threshold_change(b, &now));
        on_sample(profiler.samples(), change);
        if last.as_ref().is_some_and(|b| converged(b, &now)) {
            return Ok(profiler.profile(true));
        }
        last = Some(now);
    }
    Ok(profiler.profile(false))
}
