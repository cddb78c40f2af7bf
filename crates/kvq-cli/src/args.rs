//! Arguments shared by several subcommands: the model, the cache scheme and its options, and
//! the profile and policy files (checked against the model this process opened).

use anyhow::{bail, Context, Result};
use kvq_cache::{CacheOptions, Policy};
use kvq_calib::{ModelIdentity, PolicyFile, Profile};
use kvq_codec::{Calibration, KvSpec, SchemeKind};
use kvq_model::gemma3::Gemma3;
use kvq_model::gguf::Gguf;
use kvq_model::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Identity of the model this process opened (profile and policy files must match it).
static OPENED_MODEL: OnceLock<ModelIdentity> = OnceLock::new();

/// The identity of the model opened through [`ModelArgs::open`], for files that need one.
fn opened_model(what: &str) -> Result<&'static ModelIdentity> {
    OPENED_MODEL.get().with_context(|| {
        format!("{what} must be checked against the model's GGUF: pass --model (not shape flags)")
    })
}

use kvq_model::REFERENCE_MODEL_FILE as REFERENCE_MODEL;

/// `--model`.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// GGUF model file [default: $KVQ_MODEL, else models/gemma-3-270m-q4_k_m.gguf as fetched by
    /// scripts/setup-model.sh]
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
}

impl ModelArgs {
    /// The model path: the flag, `$KVQ_MODEL`, `./models/…`, or the repository's `models/…`.
    pub fn path(&self) -> Result<PathBuf> {
        if let Some(p) = &self.model {
            return Ok(p.clone());
        }
        if std::env::var_os("KVQ_MODEL").is_some() {
            return Ok(kvq_model::reference_model_path());
        }
        let candidates = [
            PathBuf::from("models").join(REFERENCE_MODEL),
            kvq_model::reference_model_path(),
        ];
        candidates.iter().find(|p| p.exists()).cloned().with_context(|| {
            format!("no model given and {REFERENCE_MODEL} not found in ./models; run scripts/setup-model.sh or pass --model PATH")
        })
    }

    /// Opens the GGUF file.
    /// Records its identity for [`ProfileArgs`] and [`CacheArgs`] to check files against.
    pub fn open(&self) -> Result<Gguf> {
        let path = self.path()?;
        let g = Gguf::open(&path).with_context(|| format!("loading model {}", path.display()))?;
        if let Ok(id) = ModelIdentity::of(&g) {
            OPENED_MODEL.get_or_init(|| id);
        }
        Ok(g)
    }

    /// Loads the model and its tokenizer.
    pub fn load(&self) -> Result<(Gemma3, Tokenizer)> {
        let g = self.open()?;
        let model = Gemma3::load(&g)?;
        let tokenizer = Tokenizer::from_gguf(&g)?;
        Ok((model, tokenizer))
    }
}

/// `--profile`: a calibration profile written by `kvq calibrate`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ProfileArgs {
    /// Calibration profile from `kvq calibrate` (Oaken thresholds, FP8 scales, channel scales
    /// and outlier channels for TurboQuant)
    #[arg(long, value_name = "PROFILE")]
    pub profile: Option<PathBuf>,
}

impl ProfileArgs {
    /// Per-layer (K, V) calibration: the profile's, checked against the opened model, or
    /// none (schemes that need one say so when built).
    pub fn calibration(&self, layers: usize) -> Result<Vec<(Calibration, Calibration)>> {
        let Some(path) = &self.profile else {
            return Ok(vec![
                (Calibration::default(), Calibration::default());
                layers
            ]);
        };
        let profile = Profile::from_file(&read(path)?, opened_model("--profile")?)
            .with_context(|| format!("refusing profile {}", path.display()))?;
        Ok(profile.calibration())
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Profile and policy files of a [`CacheArgs`], read and checked once.
#[derive(Clone, Debug)]
struct CacheFiles {
    policy: Option<Policy>,
    /// `None` without `--profile`.
    calibration: Option<Vec<(Calibration, Calibration)>>,
}

/// The text of `path` as tokens (BOS first), with at least `ctx` of them.
pub fn read_tokens(path: &Path, tokenizer: &Tokenizer, ctx: usize) -> Result<Vec<u32>> {
    let tokens = tokenizer.encode(&read(path)?, true);
    if tokens.len() < ctx {
        bail!(
            "{} holds {} tokens, fewer than one chunk of {ctx}",
            path.display(),
            tokens.len()
        );
    }
    Ok(tokens)
}

/// `--kv` (or `--kv-policy`), `--profile` and the cache options.
#[derive(clap::Args, Clone, Debug)]
pub struct CacheArgs {
    /// KV scheme for every layer: KIND or k=KIND,v=KIND (see `kvq codecs` for the names)
    #[arg(long, default_value = "f16", value_name = "SPEC")]
    pub kv: String,
    /// Per-layer K/V schemes from a policy file (`kvq tune --out`), used instead of --kv
    #[arg(long, value_name = "FILE", conflicts_with = "kv")]
    pub kv_policy: Option<PathBuf>,
    #[command(flatten)]
    pub profile: ProfileArgs,
    /// Normalize key channels before quantizing: keys are stored as (k − mean) / std per
    /// channel, with the profile's channel means and spreads (same bits per element; not for
    /// oaken; needs --profile)
    #[arg(long)]
    pub key_norm: bool,
    /// Newest tokens kept in 16-bit floats before they are quantized [default: 128 for kivi2/kivi4, else 0]
    #[arg(long, value_name = "TOKENS")]
    pub hot_window: Option<usize>,
    /// First tokens of each sequence kept in 16-bit floats for good (attention sinks)
    #[arg(long, default_value_t = 0, value_name = "TOKENS")]
    pub sinks: usize,
    /// Tokens per cache page [default: 64, or the key block of a KIVI -g128 scheme when larger]
    #[arg(long, value_name = "TOKENS")]
    pub page_tokens: Option<usize>,
    /// Seed of the random rotations of TurboQuant schemes
    #[arg(long, default_value_t = 0x6b7671)]
    pub rotation_seed: u64,
    /// Compute attention on 1–5-bit caches and Oaken with the f32 kernels instead of the 8-bit
    /// integer (AVX-512 VNNI, or AVX2 for every level format and KIVI's keys) ones, which round
    /// queries and softmax weights to 8 bits; slower
    #[arg(long)]
    pub f32_attention: bool,
    /// Vector instructions the CPU kernels may use: `native` (all the CPU has), `avx2` (the
    /// kernels of a CPU without AVX-512), `scalar`
    #[arg(long, value_enum, default_value_t = IsaArg::Native)]
    pub isa: IsaArg,
    #[arg(skip)]
    files: OnceLock<CacheFiles>,
}

impl CacheArgs {
    /// The parsed `--kv` value.
    pub fn spec(&self) -> Result<KvSpec> {
        Ok(KvSpec::parse(&self.kv)?)
    }

    /// Reads and checks `--kv-policy` and `--profile` (once): both whole or neither.
    fn files(&self) -> Result<&CacheFiles> {
        if let Some(f) = self.files.get() {
            return Ok(f);
        }
        let policy = match &self.kv_policy {
            Some(path) => Some(
                PolicyFile::from_file(&read(path)?, opened_model("--kv-policy")?)
                    .with_context(|| format!("refusing policy {}", path.display()))?,
            ),
            None => None,
        };
        let calibration = match self.profile.profile {
            Some(_) => Some(self.profile.calibration(0)?),
            None if self.key_norm => bail!(
                "--key-norm needs --profile: the channel means and spreads come from `kvq calibrate`"
            ),
            None => None,
        };
        let calibration = calibration.map(|layers| {
            layers
                .into_iter()
                .map(|(k, v)| {
                    let k = Calibration {
                        channel_norm: self.key_norm,
                        ..k
                    };
                    (k, v)
                })
                .collect()
        });
        Ok(self.files.get_or_init(|| CacheFiles {
            policy,
            calibration,
        }))
    }

    /// The policy for a model of `layers` layers: `--kv-policy`'s, else `--kv` everywhere.
    pub fn policy(&self, layers: usize) -> Result<Policy> {
        match &self.files()?.policy {
            Some(p) => {
                p.check_layers(layers)?;
                Ok(p.clone())
            }
            None => Ok(Policy::uniform(self.spec()?, layers)),
        }
    }

    /// Per-layer calibration: `--profile`'s (checked against the model), else none (schemes
    /// that need one say so when built).
    pub fn calibration(&self, layers: usize) -> Result<Vec<(Calibration, Calibration)>> {
        let none = || vec![(Calibration::default(), Calibration::default()); layers];
        Ok(self.files()?.calibration.clone().unwrap_or_else(none))
    }

    /// Cache options; `max_append_tokens` is the longest prefill chunk the caller will append.
    /// Also selects the attention kernels for the process (`--f32-attention`, `--isa`).
    pub fn options(&self, max_append_tokens: usize) -> Result<CacheOptions> {
        kvq_codec::levels::set_enabled(!self.f32_attention);
        self.isa.apply();
        let kinds: Vec<SchemeKind> = match &self.files()?.policy {
            Some(p) => p.layers.iter().flat_map(|l| [l.k, l.v]).collect(),
            None => {
                let spec = self.spec()?;
                vec![spec.k, spec.v]
            }
        };
        let kivi_group = kivi_group(&kinds);
        let hot_window = self
            .hot_window
            .unwrap_or(if kivi_group.is_some() { 128 } else { 0 });
        let page_tokens = self
            .page_tokens
            .unwrap_or_else(|| default_page_tokens(&kinds));
        if page_tokens == 0 {
            bail!("--page-tokens must be positive");
        }
        Ok(CacheOptions {
            page_tokens,
            hot_window,
            sink_tokens: self.sinks,
            max_append_tokens,
            seed: self.rotation_seed,
            ..CacheOptions::default()
        })
    }
}

/// The largest key block of the KIVI schemes among `kinds`, if any.
fn kivi_group(kinds: &[SchemeKind]) -> Option<usize> {
    kinds
        .iter()
        .filter_map(|k| match *k {
            SchemeKind::Kivi { group, .. } => Some(usize::from(group)),
            _ => None,
        })
        .max()
}

/// Tokens per page when none are given: 64, or the key block of a KIVI -g128 scheme.
pub fn default_page_tokens(kinds: &[SchemeKind]) -> usize {
    kivi_group(kinds).unwrap_or(0).max(64)
}

/// `--isa`: the widest vector instructions the CPU kernels may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IsaArg {
    /// All the CPU has.
    Native,
    /// AVX2/FMA/F16C, as on a CPU without AVX-512.
    Avx2,
    /// The scalar fallbacks.
    Scalar,
}

impl IsaArg {
    /// Limits the kernels of the whole process to this.
    pub fn apply(self) {
        kvq_codec::simd::set_isa_limit(match self {
            IsaArg::Native => kvq_codec::simd::Isa::Avx512,
            IsaArg::Avx2 => kvq_codec::simd::Isa::Avx2,
            IsaArg::Scalar => kvq_codec::simd::Isa::Scalar,
        });
    }

    /// The name `--isa` takes.
    pub fn name(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_string())
    }
}
