//! The OpenAI request bodies, their validation, and OpenAI-style errors.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kvq_model::sampler::SamplerConfig;
use kvq_model::tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::json;

/// An error answered as `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for people.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code, if any.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.to_string()).filter(|p| !p.is_empty()),
            code: None,
        }
    }

    /// Any status, with a code.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: Some(code),
        }
    }

    /// The error object, as sent in a body or an SSE event.
    pub fn body(&self) -> serde_json::Value {
        let kind = match self.status.as_u16() {
            429 => "rate_limit_error",
            404 if self.param.is_none() => "not_found_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        json!({"error": {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// `prompt`: a string or a list holding one string.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Prompt {
    /// One prompt.
    Text(String),
    /// A batch of prompts (only one is served per request).
    List(Vec<String>),
}

/// A message's `content`: a string or a list of parts.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts; only `{"type": "text", "text": ...}` is understood.
    Parts(Vec<Part>),
}

/// One content part.
#[derive(Deserialize, Debug)]
pub struct Part {
    /// Part type (`text`).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Deserialize, Debug)]
pub struct Message {
    /// `system`, `developer`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: Option<Content>,
}

/// `stream_options`.
#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    /// Send a last chunk with token usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields of `/v1/completions` and `/v1/chat/completions` bodies that the server reads;
/// each endpoint requires its own (`prompt` or `messages`). Unknown fields are ignored.
#[derive(Deserialize, Debug)]
pub struct Request {
    /// Model id; must be the served model's.
    pub model: String,
    /// Completions prompt.
    pub prompt: Option<Prompt>,
    /// Chat messages.
    pub messages: Option<Vec<Message>>,
    /// Tokens to generate at most.
    pub max_tokens: Option<u64>,
    /// Chat's newer name for `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    /// Sampling temperature, 0 to 2 (0 is greedy); default 1.
    pub temperature: Option<f64>,
    /// Nucleus mass, (0, 1]; default 1.
    pub top_p: Option<f64>,
    /// Sample among the k most likely tokens (0 = all); default 40. Not in OpenAI's API.
    pub top_k: Option<u64>,
    /// Sampler seed; default: a fresh one per request.
    pub seed: Option<i64>,
    /// Choices to return; only 1.
    pub n: Option<u64>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Stop sequences (not supported beyond the model's own stop tokens).
    pub stop: Option<serde_json::Value>,
    /// Log-probabilities (not supported).
    pub logprobs: Option<serde_json::Value>,
    /// Echo the prompt (not supported).
    pub echo: Option<bool>,
    /// Presence penalty (only 0).
    pub presence_penalty: Option<f64>,
    /// Frequency penalty (only 0).
    pub frequency_penalty: Option<f64>,
}

/// A request made ready for the scheduler.
#[derive(Debug)]
pub struct Prepared {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampler: SamplerConfig,
    /// Stream the answer.
    pub stream: bool,
    /// Send usage in the stream.
    pub include_usage: bool,
}

/// What validation needs to know about the server.
pub struct Limits<'a> {
    /// The served model's id.
    pub model_name: &'a str,
    /// Prompt plus generated tokens at most.
    pub max_seq_len: usize,
    /// The tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// Token ids that open and close a chat turn.
    pub turn: (u32, u32),
}

/// Parses a body into a [`Request`], naming the field at fault.
pub fn parse(body: &[u8]) -> Result<Request, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("", format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid(
            "",
            "the request body must be a JSON object",
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = if path == "." { String::new() } else { path };
        ApiError::invalid(&param, format!("invalid request: {}", e.inner()))
    })
}

impl Request {
    /// Checks everything and tokenizes: the completions prompt, or the chat messages through
    /// Gemma's chat template. User text is tokenized literally (no control tokens).
    pub fn prepare(self, chat: bool, limits: &Limits<'_>) -> Result<Prepared, ApiError> {
        if self.model != limits.model_name {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!(
                    "The model `{}` does not exist; this server serves `{}`",
                    self.model, limits.model_name
                ),
                param: Some("model".into()),
                code: Some("model_not_found"),
            });
        }
        let prompt = if chat {
            chat_prompt(self.messages.as_deref(), limits)?
        } else {
            completion_prompt(self.prompt, limits.tokenizer)?
        };
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid("n", "only n = 1 is supported"));
        }
        if self.stop.as_ref().is_some_and(|s| !s.is_null()) {
            return Err(ApiError::invalid(
                "stop",
                "stop sequences are not supported; generation stops at the model's end-of-turn token",
            ));
        }
        if self
            .logprobs
            .as_ref()
            .is_some_and(|l| !(l.is_null() || l == &json!(false) || l == &json!(0)))
        {
            return Err(ApiError::invalid("logprobs", "logprobs are not supported"));
        }
        if self.echo == Some(true) {
            return Err(ApiError::invalid("echo", "echo is not supported"));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if v.is_some_and(|v| v != 0.0) {
                return Err(ApiError::invalid(
                    name,
                    format!("{name} is not supported (only 0)"),
                ));
            }
        }
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                "temperature",
                format!("temperature must be between 0 and 2, got {temperature}"),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                "top_p",
                format!("top_p must be in (0, 1], got {top_p}"),
            ));
        }
        let vocab = limits.tokenizer.vocab_size() as u64;
        let top_k = self.top_k.unwrap_or(40);
        if top_k > vocab {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k must be at most the vocabulary size {vocab}, got {top_k}"),
            ));
        }
        let room = limits.max_seq_len.saturating_sub(prompt.len());
        let (param, asked) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => ("max_completion_tokens", Some(m)),
            (None, m) => ("max_tokens", m),
        };
        // Completions default to OpenAI's 16 tokens; chat to the room left in the context.
        let max_tokens = asked.unwrap_or(if chat { room.max(1) as u64 } else { 16 });
        if max_tokens == 0 {
            return Err(ApiError::invalid(
                param,
                format!("{param} must be at least 1"),
            ));
        }
        let total = prompt.len() as u64 + max_tokens;
        if total > limits.max_seq_len as u64 {
            return Err(ApiError {
                status: StatusCode::BAD_REQUEST,
                message: format!(
                    "This server's maximum sequence length (--max-seq-len) is {} tokens. However, you requested {total} tokens ({} in the prompt, {max_tokens} for the completion). Please reduce the prompt or {param}.",
                    limits.max_seq_len,
                    prompt.len()
                ),
                param: Some(if asked.is_some() { param } else { "messages" }.into()),
                code: Some("context_length_exceeded"),
            });
        }
        let stream = self.stream.unwrap_or(false);
        let seed = self.seed.map_or_else(fresh_seed, |s| s as u64);
        Ok(Prepared {
            prompt,
            max_tokens: max_tokens as usize,
            sampler: SamplerConfig {
                temperature: temperature as f32,
                top_k: top_k as usize,
                top_p: top_p as f32,
                seed,
            },
            stream,
            include_usage: stream && self.stream_options.is_some_and(|o| o.include_usage),
        })
    }
}

/// A seed for requests that give none.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

fn completion_prompt(prompt: Option<Prompt>, tokenizer: &Tokenizer) -> Result<Vec<u32>, ApiError> {
    let text = match prompt {
        None => return Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Prompt::Text(t)) => t,
        Some(Prompt::List(mut list)) if list.len() == 1 => list.remove(0),
        Some(Prompt::List(_)) => {
            return Err(ApiError::invalid(
                "prompt",
                "prompt must be a string or a list of exactly one string",
            ))
        }
    };
    if text.is_empty() {
        return Err(ApiError::invalid("prompt", "prompt must not be empty"));
    }
    Ok(tokenizer.encode_literal(&text, true))
}

/// Gemma's chat template: `<start_of_turn>user\n{content}<end_of_turn>\n` per turn (`model`
/// for the assistant, system text prepended to the first user turn), then
/// `<start_of_turn>model\n`.
fn chat_prompt(messages: Option<&[Message]>, limits: &Limits<'_>) -> Result<Vec<u32>, ApiError> {
    let messages = messages.ok_or_else(|| ApiError::invalid("messages", "messages is required"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let mut system = String::new();
    let mut turns: Vec<(&str, String)> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let param = format!("messages[{i}]");
        let text = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(
                                &format!("{param}.content"),
                                format!(
                                    "content part of type `{}` is not supported (only text)",
                                    p.kind
                                ),
                            ))
                        }
                    }
                }
                text
            }
        };
        match m.role.as_str() {
            "system" | "developer" => {
                if !system.is_empty() {
                    system.push_str("\n\n");
                }
                system.push_str(&text);
            }
            "user" => turns.push(("user", text)),
            "assistant" => turns.push(("model", text)),
            other => {
                return Err(ApiError::invalid(
                    &format!("{param}.role"),
                    format!("role `{other}` is not supported (system, developer, user, assistant)"),
                ))
            }
        }
    }
    if turns.iter().all(|(_, t)| t.is_empty()) && system.is_empty() {
        return Err(ApiError::invalid("messages", "messages hold no text"));
    }
    if !system.is_empty() {
        match turns.iter_mut().find(|(role, _)| *role == "user") {
            Some((_, first)) => *first = format!("{system}\n\n{first}"),
            None => turns.insert(0, ("user", system)),
        }
    }
    let tok = limits.tokenizer;
    let (start, end) = limits.turn;
    let mut ids = vec![tok.bos_id()];
    for (role, text) in &turns {
        ids.push(start);
        ids.extend(tok.encode_literal(&format!("{role}\n{text}"), false));
        ids.push(end);
        ids.extend(tok.encode_literal("\n", false));
    }
    ids.push(start);
    ids.extend(tok.encode_literal("model\n", false));
    Ok(ids)
}
