//! The scheduler: one thread that owns the model and the cache and interleaves every running
//! request, step by step (continuous batching).
//!
//! Each step: take new requests off the channel; drop the ones whose client went away
//! (releasing their pages at once); admit waiting requests in arrival order while the cache
//! accounting ([`CachePlan`]) and `--max-batch` allow; spend at most one prefill chunk of
//! prompt tokens on the oldest prefilling requests; then give every decoding request one token.
//! A long prompt therefore costs running streams at most one chunk of delay per token. The
//! model runs one sequence per call; the batch is the set of sequences the steps interleave.

use crate::metrics::Metrics;
use crate::sizing::CachePlan;
use kvq_cache::{KvCache, SeqId};
use kvq_model::gemma3::Gemma3;
use kvq_model::sampler::{Sampler, SamplerConfig};
use kvq_model::tokenizer::{StreamDecoder, Tokenizer};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// A generation request, tokenized and validated.
pub struct Job {
    /// Prompt token ids (with BOS).
    pub prompt: Vec<u32>,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampler: SamplerConfig,
    /// Where the output goes; closed when the client went away.
    pub events: UnboundedSender<Event>,
    /// When the request arrived.
    pub arrived: Instant,
}

/// Why a generation ended, in OpenAI's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop token.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl Finish {
    /// The `finish_reason` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What the scheduler sends back for a job.
#[derive(Debug)]
pub enum Event {
    /// Text of newly generated tokens (possibly empty while a character is incomplete).
    Text(String),
    /// The end, with token counts.
    Done {
        /// Why it ended.
        finish: Finish,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens.
        completion_tokens: usize,
    },
    /// The model failed on this request (the others go on).
    Failed(String),
}

/// Everything the scheduler thread owns.
pub struct Scheduler {
    /// The model.
    pub model: Gemma3,
    /// The tokenizer (shared with the HTTP side).
    pub tokenizer: Arc<Tokenizer>,
    /// The cache, built from `plan`.
    pub cache: KvCache,
    /// The page accounting.
    pub plan: CachePlan,
    /// Sequences running at once at most.
    pub max_batch: usize,
    /// Prompt tokens per step at most.
    pub prefill_chunk: usize,
    /// Token ids that end a generation.
    pub stops: Vec<u32>,
    /// Shared metrics.
    pub metrics: Arc<Metrics>,
}

/// A running request.
struct Active<'t> {
    job: Job,
    seq: SeqId,
    need: Vec<usize>,
    /// Prompt tokens already in the cache.
    prefilled: usize,
    /// Final hidden state to sample the next token from, once the prompt is in.
    hidden: Option<Vec<f32>>,
    sampler: Sampler,
    /// Taken when the request ends, to flush held-back bytes.
    decoder: Option<StreamDecoder<'t>>,
    generated: usize,
    /// Set when the model failed on this request.
    failed: bool,
    last_token: Instant,
}

impl Scheduler {
    /// Runs until the channel closes and no request is left.
    pub fn run(mut self, jobs: Receiver<Job>) {
        let tokenizer = self.tokenizer.clone();
        let mut waiting: VecDeque<Job> = VecDeque::new();
        let mut running: Vec<Active<'_>> = Vec::new();
        let mut reserved = vec![0usize; self.plan.layer_pages.len()];
        let mut open = true;
        loop {
            if running.is_empty() && waiting.is_empty() {
                match jobs.recv() {
                    Ok(job) => waiting.push_back(job),
                    Err(_) => return,
                }
            }
            while open {
                match jobs.try_recv() {
                    Ok(job) => waiting.push_back(job),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            waiting.retain(|job| {
                let gone = job.events.is_closed();
                if gone {
                    self.metrics.finished("cancelled");
                    self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                }
                !gone
            });
            running.retain_mut(|a| {
                let gone = a.job.events.is_closed();
                if gone {
                    self.end(a, &mut reserved, "cancelled");
                }
                !gone
            });
            while running.len() < self.max_batch {
                let Some(job) = waiting.front() else { break };
                let need = self.plan.pages_for(job.prompt.len() + job.max_tokens);
                if !self.plan.fits(&need, &reserved) {
                    break;
                }
                let job = waiting.pop_front().expect("front exists");
                self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                self.metrics.running.fetch_add(1, Ordering::Relaxed);
                self.metrics.prompt_tokens(job.prompt.len());
                reserved.iter_mut().zip(&need).for_each(|(r, n)| *r += n);
                running.push(Active {
                    seq: self.cache.add_sequence(),
                    sampler: Sampler::new(job.sampler),
                    decoder: Some(tokenizer.stream_decoder()),
                    failed: false,
                    need,
                    prefilled: 0,
                    hidden: None,
                    generated: 0,
                    last_token: job.arrived,
                    job,
                });
            }
            self.publish_reserved(&reserved);

            let mut budget = self.prefill_chunk;
            for a in running.iter_mut().filter(|a| a.hidden.is_none()) {
                if budget == 0 {
                    break;
                }
                let end = a.job.prompt.len().min(a.prefilled + budget);
                let chunk = &a.job.prompt[a.prefilled..end];
                let result = self
                    .model
                    .forward(&mut self.cache, a.seq, chunk, chunk.len() - 1);
                budget -= end - a.prefilled;
                match result {
                    Ok(hidden) => {
                        a.prefilled = end;
                        if end == a.job.prompt.len() {
                            a.hidden = Some(hidden);
                        }
                    }
                    Err(e) => fail(a, e.to_string()),
                }
            }
            running.retain_mut(|a| {
                if a.failed {
                    self.end(a, &mut reserved, "error");
                    return false;
                }
                let Some(hidden) = a.hidden.take() else {
                    return true;
                };
                match self.decode(a, &hidden) {
                    Some(reason) => {
                        self.end(a, &mut reserved, reason);
                        false
                    }
                    None => true,
                }
            });
            self.publish_reserved(&reserved);
        }
    }

    /// Samples and emits one token, then runs it through the model. Returns how the request
    /// ended, if it did.
    fn decode(&mut self, a: &mut Active<'_>, hidden: &[f32]) -> Option<&'static str> {
        let next = a.sampler.sample(&self.model.logits(hidden));
        if self.stops.contains(&next) {
            return Some(self.done(a, Finish::Stop));
        }
        a.generated += 1;
        let now = Instant::now();
        self.metrics.token(
            a.generated == 1,
            now.duration_since(a.last_token).as_secs_f64(),
        );
        a.last_token = now;
        let text = a
            .decoder
            .as_mut()
            .map_or_else(String::new, |d| d.push(next));
        if a.job.events.send(Event::Text(text)).is_err() {
            return Some("cancelled");
        }
        if a.generated == a.job.max_tokens {
            return Some(self.done(a, Finish::Length));
        }
        match self.model.forward(&mut self.cache, a.seq, &[next], 0) {
            Ok(h) => {
                a.hidden = Some(h);
                None
            }
            Err(e) => {
                fail(a, e.to_string());
                Some("error")
            }
        }
    }

    /// Sends the rest of the text and the end of a request.
    fn done(&self, a: &mut Active<'_>, finish: Finish) -> &'static str {
        let rest = a
            .decoder
            .take()
            .map_or_else(String::new, StreamDecoder::finish);
        if !rest.is_empty() {
            let _ = a.job.events.send(Event::Text(rest));
        }
        let _ = a.job.events.send(Event::Done {
            finish,
            prompt_tokens: a.job.prompt.len(),
            completion_tokens: a.generated,
        });
        finish.as_str()
    }

    /// Frees a request's sequence and reservation.
    fn end(&mut self, a: &Active<'_>, reserved: &mut [usize], reason: &'static str) {
        // The sequence is live: it was added at admission and is released only here.
        let _ = self.cache.release(a.seq);
        reserved.iter_mut().zip(&a.need).for_each(|(r, n)| *r -= n);
        self.metrics.finished(reason);
        self.metrics.running.fetch_sub(1, Ordering::Relaxed);
        self.publish_reserved(reserved);
    }

    /// Updates the cache gauges.
    fn publish_reserved(&self, reserved: &[usize]) {
        let (used, _) = self.cache.page_usage();
        self.metrics
            .pages_used
            .store(used as u64, Ordering::Relaxed);
        self.metrics
            .pages_reserved
            .store(reserved.iter().sum::<usize>() as u64, Ordering::Relaxed);
    }
}

/// Reports a model error to the client and marks the request for ending.
fn fail(a: &mut Active<'_>, message: String) {
    let _ = a.job.events.send(Event::Failed(message));
    a.failed = true;
}
