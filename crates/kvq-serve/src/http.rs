//! The HTTP side: routes, OpenAI response shapes, server-sent events, and handing requests to
//! the scheduler.

use crate::api::{parse, ApiError, Limits, Prepared};
use crate::metrics::Metrics;
use crate::scheduler::{Event, Finish, Job};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::sse::{self, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use kvq_model::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedReceiver;

/// Request bodies larger than this are refused (413).
const BODY_LIMIT: usize = 4 << 20;

/// What every handler shares.
pub(crate) struct AppState {
    pub jobs: Sender<Job>,
    pub metrics: Arc<Metrics>,
    pub tokenizer: Arc<Tokenizer>,
    pub model_name: String,
    pub max_seq_len: usize,
    pub max_queue: usize,
    pub turn: (u32, u32),
    pub started: u64,
    pub next_id: AtomicU64,
}

type Shared = Arc<AppState>;

/// The server's routes.
pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this endpoint",
            )
        })
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// Counts every response by path (unknown paths as `other`) and status.
async fn count(
    State(s): State<Shared>,
    req: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    let path = match req.uri().path() {
        p
        @ ("/v1/completions" | "/v1/chat/completions" | "/v1/models" | "/health" | "/metrics") => p,
        _ => "other",
    }
    .to_string();
    let response = next.run(req).await;
    s.metrics.response(&path, response.status().as_u16());
    response
}

async fn metrics(State(s): State<Shared>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
}

async fn models(State(s): State<Shared>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": s.model_name, "object": "model", "created": s.started, "owned_by": "kvq",
    }]}))
}

async fn completions(State(s): State<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(s, false, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn chat_completions(
    State(s): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(s, true, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Validates, queues, and answers a generation request (streamed or whole).
async fn generate(
    s: Shared,
    chat: bool,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = body.map_err(|e| ApiError {
        status: e.status(),
        message: e.body_text(),
        param: None,
        code: None,
    })?;
    let limits = Limits {
        model_name: &s.model_name,
        max_seq_len: s.max_seq_len,
        tokenizer: &s.tokenizer,
        turn: s.turn,
    };
    let p = parse(&body)?.prepare(chat, &limits)?;
    let rx = submit(&s, &p, arrived)?;
    let reply = Reply {
        chat,
        id: format!(
            "{}-{}",
            if chat { "chatcmpl" } else { "cmpl" },
            s.next_id.fetch_add(1, Ordering::Relaxed)
        ),
        created: unix_now(),
        model: s.model_name.clone(),
    };
    if p.stream {
        Ok(stream(reply, rx, p.include_usage).into_response())
    } else {
        whole(reply, rx).await
    }
}

/// Queues a job, or refuses it with 429 when the queue is full.
fn submit(
    s: &AppState,
    p: &Prepared,
    arrived: Instant,
) -> Result<UnboundedReceiver<Event>, ApiError> {
    let waiting = s.metrics.waiting.fetch_add(1, Ordering::Relaxed) as usize;
    if waiting >= s.max_queue {
        s.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
        s.metrics.finished("rejected");
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "queue_full",
            format!("the KV cache is full and {waiting} requests are already waiting; retry later"),
        ));
    }
    let (events, rx) = tokio::sync::mpsc::unbounded_channel();
    let job = Job {
        prompt: p.prompt.clone(),
        max_tokens: p.max_tokens,
        sampler: p.sampler,
        events,
        arrived,
    };
    s.jobs.send(job).map_err(|_| {
        s.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the scheduler has stopped",
        )
    })?;
    Ok(rx)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The identity of one response and how its objects are shaped.
struct Reply {
    chat: bool,
    id: String,
    created: u64,
    model: String,
}

impl Reply {
    fn usage(prompt: usize, completion: usize) -> Value {
        json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
    }

    /// A complete (non-streamed) response.
    fn whole(&self, text: String, finish: Finish, usage: Value) -> Value {
        let choice = if self.chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish.as_str()})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish.as_str()})
        };
        let object = if self.chat {
            "chat.completion"
        } else {
            "text_completion"
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [choice], "usage": usage})
    }

    /// A streamed chunk: `delta` is the new text (chat: the delta object), `finish` the
    /// finish reason of the last chunk; `choices` is empty when `usage` is given.
    fn chunk(&self, delta: Value, finish: Option<Finish>, usage: Option<Value>) -> sse::Event {
        let finish = finish.map(Finish::as_str);
        let choices = if usage.is_some() {
            json!([])
        } else if self.chat {
            json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}])
        } else {
            json!([{"index": 0, "text": delta, "logprobs": null, "finish_reason": finish}])
        };
        let object = if self.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let mut v = json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        sse::Event::default().data(v.to_string())
    }

    fn text_delta(&self, text: String) -> Value {
        if self.chat {
            json!({"content": text})
        } else {
            Value::String(text)
        }
    }
}

fn failed(message: String) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "generation_failed",
        message,
    )
}

/// Collects the whole answer.
async fn whole(reply: Reply, mut rx: UnboundedReceiver<Event>) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text(t) => text.push_str(&t),
            Event::Failed(m) => return Err(failed(m)),
            Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
            } => {
                let usage = Reply::usage(prompt_tokens, completion_tokens);
                return Ok(Json(reply.whole(text, finish, usage)).into_response());
            }
        }
    }
    Err(failed("the scheduler stopped".into()))
}

/// Streams the answer as server-sent events, ending with `data: [DONE]`. Dropping the stream
/// (the client went away) drops `rx`, which tells the scheduler to free the request.
fn stream(reply: Reply, rx: UnboundedReceiver<Event>, include_usage: bool) -> Response {
    let mut queued = VecDeque::new();
    if reply.chat {
        queued.push_back(reply.chunk(json!({"role": "assistant", "content": ""}), None, None));
    }
    let state = (reply, Some(rx), queued);
    let events =
        futures_util::stream::unfold(state, move |(reply, mut rx, mut queued)| async move {
            loop {
                if let Some(e) = queued.pop_front() {
                    return Some((Ok::<_, Infallible>(e), (reply, rx, queued)));
                }
                let event = rx.as_mut()?.recv().await;
                match event {
                    Some(Event::Text(t)) if t.is_empty() => {}
                    Some(Event::Text(t)) => {
                        queued.push_back(reply.chunk(reply.text_delta(t), None, None))
                    }
                    Some(Event::Done {
                        finish,
                        prompt_tokens,
                        completion_tokens,
                    }) => {
                        let empty = if reply.chat { json!({}) } else { json!("") };
                        queued.push_back(reply.chunk(empty, Some(finish), None));
                        if include_usage {
                            let usage = Reply::usage(prompt_tokens, completion_tokens);
                            queued.push_back(reply.chunk(Value::Null, None, Some(usage)));
                        }
                        queued.push_back(sse::Event::default().data("[DONE]"));
                        rx = None;
                    }
                    Some(Event::Failed(m)) => {
                        queued.push_back(sse::Event::default().data(failed(m).body().to_string()));
                        rx = None;
                    }
                    None => {
                        let e = failed("the scheduler stopped".into());
                        queued.push_back(sse::Event::default().data(e.body().to_string()));
                        rx = None;
                    }
                }
            }
        });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
