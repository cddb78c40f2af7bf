//! # kvq-serve
//!
//! Serves a model over the compressed KV cache as an OpenAI-compatible HTTP server:
//! `/v1/completions` and `/v1/chat/completions` (whole or streamed as server-sent events),
//! `/v1/models`, `/health` and `/metrics` (Prometheus text).
//!
//! * HTTP runs on a small tokio runtime; requests are validated and tokenized there, and
//!   every error is an OpenAI-style body (`{"error": {"message", "type", "param", "code"}}`).
//! * One dedicated scheduler thread owns the model and the cache and does continuous batching
//!   ([`scheduler`]): requests join between decode steps, prompts are prefilled in chunks.
//! * The cache pool is sized from a memory budget and requests are admitted by the same page
//!   accounting as `kvq memory` ([`sizing`]); when the cache is full they wait in a bounded
//!   queue, beyond which they get 429 with `Retry-After`.

pub mod api;
mod http;
mod metrics;
pub mod scheduler;
pub mod sizing;

use kvq_cache::{CacheOptions, KvCache, Policy};
use kvq_codec::Calibration;
use kvq_model::gemma3::Gemma3;
use kvq_model::tokenizer::Tokenizer;
use sizing::CachePlan;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How to serve.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The id clients must name in `model`.
    pub model_name: String,
    /// K/V scheme of each layer.
    pub policy: Policy,
    /// Per-layer (K, V) calibration.
    pub calibration: Vec<(Calibration, Calibration)>,
    /// Cache options; `max_append_tokens` must be at least `prefill_chunk`.
    pub options: CacheOptions,
    /// Sequences running at once at most.
    pub max_batch: usize,
    /// Prompt plus generated tokens of one request at most.
    pub max_seq_len: usize,
    /// Bytes the cache may allocate.
    pub cache_memory: usize,
    /// Requests waiting for admission at most; more get 429.
    pub max_queue: usize,
    /// Prompt tokens prefilled per scheduler step at most.
    pub prefill_chunk: usize,
}

/// Errors that stop the server from starting.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A setting that cannot work.
    #[error("{0}")]
    Config(String),
    /// The cache could not be built.
    #[error(transparent)]
    Cache(#[from] kvq_cache::CacheError),
    /// Socket or runtime trouble.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    plan: CachePlan,
    runtime: tokio::runtime::Runtime,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Builds the cache, starts the scheduler thread and serves on `listener`.
    pub fn start(
        model: Gemma3,
        tokenizer: Tokenizer,
        config: ServeConfig,
        listener: std::net::TcpListener,
    ) -> Result<Self, ServeError> {
        let c = &model.config;
        if config.prefill_chunk == 0 || config.options.max_append_tokens < config.prefill_chunk {
            return Err(ServeError::Config(format!(
                "prefill chunk of {} tokens must be positive and at most the cache's max_append_tokens ({})",
                config.prefill_chunk, config.options.max_append_tokens
            )));
        }
        if config.max_seq_len > c.context_length {
            return Err(ServeError::Config(format!(
                "--max-seq-len {} exceeds the model's context of {} tokens",
                config.max_seq_len, c.context_length
            )));
        }
        let turn = match (
            tokenizer.token_id("<start_of_turn>"),
            tokenizer.token_id("<end_of_turn>"),
        ) {
            (Some(s), Some(e)) => (s, e),
            _ => return Err(ServeError::Config(
                "the tokenizer has no <start_of_turn>/<end_of_turn> tokens for the chat template"
                    .into(),
            )),
        };
        let shapes = c.layer_shapes();
        let plan = CachePlan::new(
            &shapes,
            &config.policy,
            &config.options,
            config.max_batch,
            config.max_seq_len,
            config.cache_memory,
        )?;
        let cache = KvCache::new(
            &shapes,
            &config.policy,
            &config.calibration,
            config.options,
            plan.slot_tokens,
            plan.slots,
        )?;
        let metrics = Arc::new(metrics::Metrics::default());
        let (_, total) = cache.page_usage();
        metrics.pages_total.store(total as u64, Ordering::Relaxed);
        metrics
            .cache_bytes
            .store(plan.bytes as u64, Ordering::Relaxed);
        let milli = |x: f64| (x * 1000.0).round() as u64;
        metrics
            .bits_per_element_milli
            .store(milli(plan.bits_per_element), Ordering::Relaxed);
        metrics
            .compression_milli
            .store(milli(plan.compression_ratio), Ordering::Relaxed);

        let tokenizer = Arc::new(tokenizer);
        let (jobs, rx) = std::sync::mpsc::channel();
        let scheduler = scheduler::Scheduler {
            stops: vec![tokenizer.eos_id(), turn.1],
            model,
            tokenizer: tokenizer.clone(),
            cache,
            plan: plan.clone(),
            max_batch: config.max_batch,
            prefill_chunk: config.prefill_chunk,
            metrics: metrics.clone(),
        };
        std::thread::Builder::new()
            .name("kvq-scheduler".into())
            .spawn(move || scheduler.run(rx))?;

        let state = Arc::new(http::AppState {
            jobs,
            metrics,
            tokenizer,
            model_name: config.model_name,
            max_seq_len: config.max_seq_len,
            max_queue: config.max_queue,
            turn,
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            next_id: AtomicU64::new(0),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kvq-http")
            .enable_all()
            .build()?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let task = runtime.spawn(async move { axum::serve(listener, http::router(state)).await });
        Ok(Self {
            addr,
            plan,
            runtime,
            task,
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How the cache pool was sized.
    pub fn plan(&self) -> &CachePlan {
        &self.plan
    }

    /// Serves until the listener fails.
    pub fn wait(self) -> Result<(), ServeError> {
        match self.runtime.block_on(self.task) {
            Ok(result) => Ok(result?),
            Err(e) => Err(ServeError::Io(std::io::Error::other(e))),
        }
    }
}
