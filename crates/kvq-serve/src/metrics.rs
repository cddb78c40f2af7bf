//! Counters, gauges and latency histograms, rendered in the Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 120.0,
];

/// A cumulative histogram of seconds.
#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (c, bound) in self.counts.iter_mut().zip(BUCKETS) {
            if seconds <= bound {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, bound) in self.counts.iter().zip(BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.count);
    }
}

/// Everything `/metrics` reports; shared by the HTTP handlers and the scheduler.
#[derive(Default)]
pub struct Metrics {
    /// HTTP responses by (path, status).
    responses: Mutex<BTreeMap<(String, u16), u64>>,
    /// Generation requests by how they ended (`stop`, `length`, `cancelled`, `error`).
    finished: Mutex<BTreeMap<&'static str, u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
    /// Sequences decoding or prefilling.
    pub running: AtomicU64,
    /// Requests waiting for admission (submitted, not yet running).
    pub waiting: AtomicU64,
    /// Cache pages holding data.
    pub pages_used: AtomicU64,
    /// Cache pages reserved by admitted requests.
    pub pages_reserved: AtomicU64,
    /// Cache pages in the pool.
    pub pages_total: AtomicU64,
    /// Bits per element, ×1000 (set once).
    pub bits_per_element_milli: AtomicU64,
    /// Compression ratio against a 16-bit cache, ×1000 (set once).
    pub compression_milli: AtomicU64,
    /// Bytes the cache pool allocates (set once).
    pub cache_bytes: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    /// Counts one HTTP response.
    pub fn response(&self, path: &str, status: u16) {
        *lock(&self.responses)
            .entry((path.to_string(), status))
            .or_default() += 1;
    }

    /// Counts a generation request that ended with `reason`.
    pub fn finished(&self, reason: &'static str) {
        *lock(&self.finished).entry(reason).or_default() += 1;
    }

    /// Counts the prompt tokens of an admitted request.
    pub fn prompt_tokens(&self, n: usize) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records a generated token and the seconds since the request arrived (first token) or
    /// since the previous token.
    pub fn token(&self, first: bool, seconds: f64) {
        self.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let h = if first { &self.ttft } else { &self.itl };
        lock(h).observe(seconds);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.push_str("# HELP kvq_http_responses_total HTTP responses by path and status.\n# TYPE kvq_http_responses_total counter\n");
        for ((path, status), n) in lock(&self.responses).iter() {
            let _ = writeln!(
                out,
                "kvq_http_responses_total{{path=\"{path}\",status=\"{status}\"}} {n}"
            );
        }
        out.push_str("# HELP kvq_requests_total Generation requests by how they ended.\n# TYPE kvq_requests_total counter\n");
        for (reason, n) in lock(&self.finished).iter() {
            let _ = writeln!(out, "kvq_requests_total{{finish=\"{reason}\"}} {n}");
        }
        let scalar = |out: &mut String, name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        let counters = [
            (
                "kvq_prompt_tokens_total",
                "Prompt tokens of admitted requests.",
                &self.prompt_tokens,
            ),
            (
                "kvq_generated_tokens_total",
                "Tokens generated.",
                &self.generated_tokens,
            ),
        ];
        for (name, help, v) in counters {
            scalar(&mut out, name, "counter", help, get(v).to_string());
        }
        let gauges = [
            (
                "kvq_requests_running",
                "Sequences prefilling or decoding.",
                &self.running,
            ),
            (
                "kvq_requests_waiting",
                "Requests waiting for cache memory.",
                &self.waiting,
            ),
            (
                "kvq_cache_blocks_used",
                "Cache pages holding data (all layers).",
                &self.pages_used,
            ),
            (
                "kvq_cache_blocks_reserved",
                "Cache pages reserved by admitted requests.",
                &self.pages_reserved,
            ),
            (
                "kvq_cache_bytes",
                "Bytes allocated by the cache pool.",
                &self.cache_bytes,
            ),
        ];
        for (name, help, v) in gauges {
            scalar(&mut out, name, "gauge", help, get(v).to_string());
        }
        let free = get(&self.pages_total).saturating_sub(get(&self.pages_used));
        scalar(
            &mut out,
            "kvq_cache_blocks_free",
            "gauge",
            "Cache pages free (all layers).",
            free.to_string(),
        );
        let milli = |v: &AtomicU64| (get(v) as f64 / 1000.0).to_string();
        scalar(
            &mut out,
            "kvq_cache_bits_per_element",
            "gauge",
            "Bits per cached K/V element, every scale and index counted.",
            milli(&self.bits_per_element_milli),
        );
        scalar(
            &mut out,
            "kvq_cache_compression_ratio",
            "gauge",
            "Bytes of a 16-bit cache over bytes of this cache, same sequence length.",
            milli(&self.compression_milli),
        );
        lock(&self.ttft).render(
            &mut out,
            "kvq_time_to_first_token_seconds",
            "Seconds from request arrival to its first generated token.",
        );
        lock(&self.itl).render(
            &mut out,
            "kvq_inter_token_latency_seconds",
            "Seconds between consecutive generated tokens of one request.",
        );
        out
    }
}
