//! Arguments shared by several subcommands: the model, the cache scheme and its options.

use anyhow::{bail, Context, Result};
use kvq_cache::{CacheOptions, Policy};
use kvq_codec::{Calibration, KvSpec, SchemeKind};
use kvq_model::gemma3::Gemma3;
use kvq_model::gguf::Gguf;
use kvq_model::tokenizer::Tokenizer;
use std::path::PathBuf;

/// File name of the reference model that `scripts/setup-model.sh` assembles.
const REFERENCE_MODEL: &str = "gemma-3-270m-q4_k_m.gguf";

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
        if let Ok(p) = std::env::var("KVQ_MODEL") {
            return Ok(PathBuf::from(p));
        }
        let candidates = [
            PathBuf::from("models").join(REFERENCE_MODEL),
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models")
                .join(REFERENCE_MODEL),
        ];
        candidates.iter().find(|p| p.exists()).cloned().with_context(|| {
            format!("no model given and {REFERENCE_MODEL} not found in ./models; run scripts/setup-model.sh or pass --model PATH")
        })
    }

    /// Opens the GGUF file.
    pub fn open(&self) -> Result<Gguf> {
        let path = self.path()?;
        Gguf::open(&path).with_context(|| format!("loading model {}", path.display()))
    }

    /// Loads the model and its tokenizer.
    pub fn load(&self) -> Result<(Gemma3, Tokenizer)> {
        let g = self.open()?;
        let model = Gemma3::load(&g)?;
        let tokenizer = Tokenizer::from_gguf(&g)?;
        Ok((model, tokenizer))
    }
}

/// `--kv` and the cache options.
#[derive(clap::Args, Clone, Debug)]
pub struct CacheArgs {
    /// KV scheme for every layer: KIND or k=KIND,v=KIND (see `kvq codecs` for the names)
    #[arg(long, default_value = "f16", value_name = "SPEC")]
    pub kv: String,
    /// Newest tokens kept in 16-bit floats before they are quantized [default: 128 for kivi2/kivi4, else 0]
    #[arg(long, value_name = "TOKENS")]
    pub hot_window: Option<usize>,
    /// First tokens of each sequence kept in 16-bit floats for good (attention sinks)
    #[arg(long, default_value_t = 0, value_name = "TOKENS")]
    pub sinks: usize,
    /// Tokens per cache page
    #[arg(long, default_value_t = 64, value_name = "TOKENS")]
    pub page_tokens: usize,
    /// Seed of the random rotations of TurboQuant schemes
    #[arg(long, default_value_t = 0x6b7671)]
    pub rotation_seed: u64,
}

impl CacheArgs {
    /// The parsed `--kv` value.
    pub fn spec(&self) -> Result<KvSpec> {
        Ok(KvSpec::parse(&self.kv)?)
    }

    /// The policy for a model of `layers` layers.
    pub fn policy(&self, layers: usize) -> Result<Policy> {
        Ok(Policy::uniform(self.spec()?, layers))
    }

    /// Per-layer calibration (none yet: schemes that need a profile say so when built).
    pub fn calibration(&self, layers: usize) -> Vec<(Calibration, Calibration)> {
        vec![(Calibration::default(), Calibration::default()); layers]
    }

    /// Cache options; `max_append_tokens` is the longest prefill chunk the caller will append.
    pub fn options(&self, max_append_tokens: usize) -> Result<CacheOptions> {
        let spec = self.spec()?;
        let kivi = |k: SchemeKind| matches!(k, SchemeKind::Kivi { .. });
        let hot_window =
            self.hot_window
                .unwrap_or(if kivi(spec.k) || kivi(spec.v) { 128 } else { 0 });
        if self.page_tokens == 0 {
            bail!("--page-tokens must be positive");
        }
        Ok(CacheOptions {
            page_tokens: self.page_tokens,
            hot_window,
            sink_tokens: self.sinks,
            max_append_tokens,
            seed: self.rotation_seed,
        })
    }
}
