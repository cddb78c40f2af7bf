//! The server on the reference model, driven over HTTP on 127.0.0.1 by real clients: ureq, and
//! the official `openai` Python package. Generations stay a few tokens long.
//!
//! The model comes from `$KVQ_MODEL`, else `<workspace>/models/gemma-3-270m-q4_k_m.gguf`.

use kvq_cache::{CacheOptions, KvCache, Policy};
use kvq_codec::{Calibration, KvSpec};
use kvq_model::gemma3::Gemma3;
use kvq_model::gguf::Gguf;
use kvq_model::sampler::{Sampler, SamplerConfig};
use kvq_model::tokenizer::Tokenizer;
use kvq_serve::{ServeConfig, Server};
use serde_json::{json, Value};
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const MODEL: &str = "gemma-3-270m-q4_k_m";

fn load() -> (Gemma3, Tokenizer) {
    let path = kvq_model::reference_model_path();
    let g = Gguf::open(&path).unwrap_or_else(|e| {
        panic!(
            "reference model {}: {e}; run scripts/setup-model.sh",
            path.display()
        )
    });
    (Gemma3::load(&g).unwrap(), Tokenizer::from_gguf(&g).unwrap())
}

fn config(kv: &str, max_batch: usize, max_queue: usize) -> (ServeConfig, Policy) {
    let policy = Policy::uniform(KvSpec::parse(kv).unwrap(), 18);
    let config = ServeConfig {
        model_name: MODEL.into(),
        policy: policy.clone(),
        calibration: vec![(Calibration::default(), Calibration::default()); 18],
        options: CacheOptions {
            max_append_tokens: 64,
            ..CacheOptions::default()
        },
        max_batch,
        max_seq_len: 512,
        cache_memory: 64 << 20,
        max_queue,
        prefill_chunk: 64,
    };
    (config, policy)
}

fn start(kv: &str, max_batch: usize, max_queue: usize) -> Server {
    let (model, tokenizer) = load();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    Server::start(
        model,
        tokenizer,
        config(kv, max_batch, max_queue).0,
        listener,
    )
    .unwrap()
}

/// The server most tests share (q4_0 cache).
fn shared() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| start("q4_0", 4, 16))
}

fn url(server: &Server, path: &str) -> String {
    format!("http://{}{path}", server.addr())
}

/// POSTs a raw body; returns status and parsed JSON body.
fn post_raw(server: &Server, path: &str, body: &str) -> (u16, Value) {
    let r = ureq::post(&url(server, path))
        .set("content-type", "application/json")
        .send_string(body);
    let response = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport error: {e}"),
    };
    let status = response.status();
    (status, response.into_json().expect("JSON body"))
}

fn post(server: &Server, path: &str, body: Value) -> (u16, Value) {
    post_raw(server, path, &body.to_string())
}

/// What a streamed request ended as.
enum Streamed {
    /// Data payloads before `[DONE]`.
    Done(Vec<Value>),
    /// Refused with 429 (with a Retry-After header).
    Refused,
}

fn post_stream(server: &Server, path: &str, body: Value) -> Streamed {
    let r = ureq::post(&url(server, path)).send_json(body);
    let response = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(429, r)) => {
            assert_eq!(r.header("retry-after"), Some("1"));
            let body: Value = r.into_json().unwrap();
            assert_eq!(body["error"]["type"], "rate_limit_error");
            return Streamed::Refused;
        }
        Err(e) => panic!("stream request failed: {e}"),
    };
    assert!(response.content_type().starts_with("text/event-stream"));
    let mut chunks = Vec::new();
    for line in std::io::BufReader::new(response.into_reader()).lines() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            return Streamed::Done(chunks);
        }
        let v: Value = serde_json::from_str(data).unwrap();
        assert!(v.get("error").is_none(), "error in stream: {v}");
        chunks.push(v);
    }
    panic!("stream ended without [DONE]");
}

fn stream_text(chunks: &[Value], chat: bool) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| {
            if chat {
                c["delta"]["content"].as_str().unwrap_or("").to_string()
            } else {
                c["text"].as_str().unwrap().to_string()
            }
        })
        .collect()
}

fn metric(server: &Server, name: &str) -> f64 {
    let text = ureq::get(&url(server, "/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
}

/// Waits until no page is used or reserved and nothing runs or waits.
fn wait_idle(server: &Server) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let busy: f64 = [
            "kvq_cache_blocks_used",
            "kvq_cache_blocks_reserved",
            "kvq_requests_running",
            "kvq_requests_waiting",
        ]
        .iter()
        .map(|m| metric(server, m))
        .sum();
        if busy == 0.0 {
            return;
        }
        assert!(Instant::now() < deadline, "cache blocks still in use");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What `kvq generate --kv KV -p PROMPT -n N` (greedy) prints, computed the same way in process.
fn reference(kv: &str, prompt: &str, max_tokens: usize) -> String {
    let (model, tok) = load();
    let (cfg, policy) = config(kv, 1, 1);
    let ids = tok.encode(prompt, true);
    let mut cache = KvCache::new(
        &model.config.layer_shapes(),
        &policy,
        &cfg.calibration,
        cfg.options,
        ids.len() + max_tokens,
        1,
    )
    .unwrap();
    let seq = cache.add_sequence();
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    });
    let stops = [tok.eos_id(), tok.token_id("<end_of_turn>").unwrap()];
    let mut hidden = Vec::new();
    for chunk in ids.chunks(cfg.prefill_chunk) {
        hidden = model
            .forward(&mut cache, seq, chunk, chunk.len() - 1)
            .unwrap();
    }
    let mut out = Vec::new();
    for _ in 0..max_tokens {
        let next = sampler.sample(&model.logits(&hidden));
        if stops.contains(&next) {
            break;
        }
        out.push(next);
        if out.len() == max_tokens {
            break;
        }
        hidden = model.forward(&mut cache, seq, &[next], 0).unwrap();
    }
    tok.decode(&out)
}

fn assert_error(status: u16, body: &Value, want_status: u16, param: Option<&str>) {
    assert_eq!(status, want_status, "{body}");
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(e["type"].is_string(), "{body}");
    assert!(
        e.get("code").is_some() && e.get("param").is_some(),
        "{body}"
    );
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{body}");
    }
}

#[test]
fn bad_requests_get_openai_errors_and_do_not_disturb_others() {
    let s = shared();
    let c = "/v1/completions";
    let ok = json!({"model": MODEL, "prompt": "Hello", "max_tokens": 2, "temperature": 0});
    let cases: Vec<(String, u16, Option<&str>)> = vec![
        ("{not json".into(), 400, None),
        ("[1, 2]".into(), 400, None),
        (json!({"prompt": "x"}).to_string(), 400, None),
        (
            json!({"model": MODEL, "prompt": "x", "max_tokens": "many"}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"model": MODEL, "prompt": "x", "max_tokens": -1}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"model": MODEL, "prompt": 5}).to_string(),
            400,
            Some("prompt"),
        ),
        (
            json!({"model": "gpt-4", "prompt": "x"}).to_string(),
            404,
            Some("model"),
        ),
        (
            json!({"model": MODEL, "prompt": ""}).to_string(),
            400,
            Some("prompt"),
        ),
        (json!({"model": MODEL}).to_string(), 400, Some("prompt")),
        (
            json!({"model": MODEL, "prompt": "x", "temperature": 7.5}).to_string(),
            400,
            Some("temperature"),
        ),
        (
            json!({"model": MODEL, "prompt": "x", "top_p": 0}).to_string(),
            400,
            Some("top_p"),
        ),
        (
            json!({"model": MODEL, "prompt": "x", "n": 3}).to_string(),
            400,
            Some("n"),
        ),
        (
            json!({"model": MODEL, "prompt": "x", "max_tokens": 0}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"model": MODEL, "prompt": "x", "max_tokens": 1_000_000_000u64}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"model": MODEL, "prompt": "x", "max_tokens": 1e300}).to_string(),
            400,
            Some("max_tokens"),
        ),
    ];
    for (body, status, param) in &cases {
        let (got, v) = post_raw(s, c, body);
        assert_error(got, &v, *status, *param);
    }
    let (got, v) = post(
        s,
        c,
        json!({"model": MODEL, "prompt": "x", "max_tokens": 1_000_000}),
    );
    assert_error(got, &v, 400, Some("max_tokens"));
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert!(v["error"]["message"].as_str().unwrap().contains("512"));

    let chat = "/v1/chat/completions";
    for (body, param) in [
        (json!({"model": MODEL}), "messages"),
        (json!({"model": MODEL, "messages": []}), "messages"),
        (json!({"model": MODEL, "messages": "hi"}), "messages"),
        (
            json!({"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}),
            "messages[0].role",
        ),
        (
            json!({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content",
        ),
    ] {
        let (got, v) = post(s, chat, body);
        assert_error(got, &v, 400, Some(param));
    }
    let r = ureq::get(&url(s, c)).call();
    let Err(ureq::Error::Status(405, r)) = r else {
        panic!("GET on a POST route")
    };
    assert!(r.into_json::<Value>().unwrap()["error"].is_object());
    let Err(ureq::Error::Status(404, _)) = ureq::get(&url(s, "/v2/nothing")).call() else {
        panic!("unknown path")
    };
    // The server still answers properly.
    let (got, v) = post(s, c, ok);
    assert_eq!(got, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 2);
}

#[test]
fn completion_whole_and_streamed_agree() {
    let s = shared();
    let body = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0});
    let (status, whole) = post(s, "/v1/completions", body.clone());
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(whole["usage"]["completion_tokens"], 5);
    assert_eq!(
        whole["usage"]["total_tokens"].as_u64(),
        Some(whole["usage"]["prompt_tokens"].as_u64().unwrap() + 5)
    );
    let mut stream_body = body;
    stream_body["stream"] = json!(true);
    stream_body["stream_options"] = json!({"include_usage": true});
    let Streamed::Done(chunks) = post_stream(s, "/v1/completions", stream_body) else {
        panic!("refused")
    };
    assert_eq!(
        stream_text(&chunks, false),
        choice["text"].as_str().unwrap()
    );
    assert_eq!(chunks.last().unwrap()["usage"], whole["usage"]);
    assert_eq!(
        reference("q4_0", "The capital of France is", 5),
        choice["text"].as_str().unwrap()
    );
}

#[test]
fn chat_completion_uses_the_template_and_streams() {
    let s = shared();
    let body = json!({"model": MODEL, "temperature": 0, "max_tokens": 4, "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}]});
    let (status, whole) = post(s, "/v1/chat/completions", body.clone());
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty());
    // <bos> <start_of_turn>user\n…<end_of_turn>\n<start_of_turn>model\n
    let tok =
        Tokenizer::from_gguf(&Gguf::open(&kvq_model::reference_model_path()).unwrap()).unwrap();
    let expected = tok.encode(
        "<start_of_turn>user\nAnswer briefly.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
        true,
    );
    assert_eq!(whole["usage"]["prompt_tokens"], expected.len());
    let mut stream_body = body;
    stream_body["stream"] = json!(true);
    let Streamed::Done(chunks) = post_stream(s, "/v1/chat/completions", stream_body) else {
        panic!("refused")
    };
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.last().unwrap()["choices"][0]["finish_reason"].is_string());
    assert_eq!(stream_text(&chunks, true), text);
}

#[test]
fn models_health_and_metrics() {
    let s = shared();
    let models: Value = ureq::get(&url(s, "/v1/models"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    let health: Value = ureq::get(&url(s, "/health"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(health["status"], "ok");
    let bits = metric(s, "kvq_cache_bits_per_element");
    assert!(bits > 4.0 && bits < 5.0, "q4_0 bits {bits}");
    assert!(metric(s, "kvq_cache_compression_ratio") > 3.0);
    assert!(metric(s, "kvq_cache_blocks_free") > 0.0);
}

/// The official `openai` package, from a venv under target/ (created, with the package
/// installed by pip, when missing).
#[test]
fn openai_python_client_streams_a_chat() {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/openai-venv");
    let python = venv.join("bin/python");
    let has_openai = |p: &std::path::Path| {
        std::process::Command::new(p)
            .args(["-c", "import openai"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has_openai(&python) {
        let ok = std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success())
            && std::process::Command::new(&python)
                .args(["-m", "pip", "install", "--quiet", "openai"])
                .status()
                .is_ok_and(|s| s.success());
        assert!(
            ok && has_openai(&python),
            "could not install the openai package into {}",
            venv.display()
        );
    }
    let s = shared();
    let script = r#"
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none")
stream = client.chat.completions.create(
    model=sys.argv[2], messages=[{"role": "user", "content": "Say hello."}],
    max_tokens=4, temperature=0, stream=True, stream_options={"include_usage": True})
text, usage, chunks = "", None, 0
for chunk in stream:
    chunks += 1
    if chunk.choices and chunk.choices[0].delta.content:
        text += chunk.choices[0].delta.content
    if chunk.usage:
        usage = chunk.usage
assert usage is not None and usage.completion_tokens >= 1, usage
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    raise SystemExit("unknown model accepted")
except openai.NotFoundError as e:
    assert e.body["code"] == "model_not_found", e.body
print(f"{chunks} {usage.completion_tokens} {text!r}")
"#;
    let out = std::process::Command::new(&python)
        .args(["-c", script, &url(s, "/v1"), MODEL])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let chunks: usize = stdout.split(' ').next().unwrap().parse().unwrap();
    assert!(chunks >= 3, "{stdout}");
}

/// 64 concurrent streams against 4 running + 12 waiting: each completes (with the output of
/// `kvq generate` for its prompt) or gets 429; afterwards no block is used. Then a client that
/// disconnects mid-stream frees its blocks.
#[test]
fn load_64_streams_then_disconnect() {
    let server = start("q8_0", 4, 12);
    let prompts = [
        "The capital of France is",
        "Water boils at",
        "One, two, three,",
        "The largest planet is",
    ];
    let expected: Vec<String> = prompts.iter().map(|p| reference("q8_0", p, 3)).collect();
    let results: Vec<Option<String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..64)
            .map(|i| {
                let server = &server;
                let prompt = prompts[i % prompts.len()];
                scope.spawn(move || {
                    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 3,
                        "temperature": 0, "seed": 7, "stream": true});
                    match post_stream(server, "/v1/completions", body) {
                        Streamed::Done(chunks) => Some(stream_text(&chunks, false)),
                        Streamed::Refused => None,
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let completed = results.iter().flatten().count();
    // At least the queue's 12 are accepted; with 64 at once, some are refused.
    assert!((12..64).contains(&completed), "{completed} of 64 completed");
    for (i, r) in results.iter().enumerate() {
        if let Some(text) = r {
            assert_eq!(text, &expected[i % prompts.len()], "request {i}");
        }
    }
    wait_idle(&server);

    // A client that goes away mid-stream.
    let response = ureq::post(&url(&server, "/v1/completions"))
        .send_json(json!({"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 400, "stream": true}))
        .unwrap();
    let mut lines = std::io::BufReader::new(response.into_reader()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("data: "), "{first}");
    assert!(metric(&server, "kvq_cache_blocks_reserved") > 0.0);
    drop(lines);
    wait_idle(&server);
}
