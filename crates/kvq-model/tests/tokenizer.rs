//! The tokenizer against llama.cpp's `llama-tokenize` ids for the reference model
//! (`shared/data/tokenizer/`), plus decoding and streaming checks.
//!
//! The model comes from `$KVQ_MODEL`, else `<workspace>/models/gemma-3-270m-q4_k_m.gguf`. Run the
//! big-file tests in release mode: `cargo test --release -p kvq-model --test tokenizer`.

use kvq_model::gguf::{Gguf, Value as MetaValue};
use kvq_model::tokenizer::{TokenKind, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn shared_data(rel: &str) -> PathBuf {
    workspace_root().join("../shared/data").join(rel)
}

/// The reference model: `$KVQ_MODEL`, else the workspace's `models/` copy; fails when absent.
fn model_path() -> PathBuf {
    let path = kvq_model::reference_model_path();
    assert!(
        path.exists(),
        "reference model not found at {}: run scripts/setup-model.sh (or set KVQ_MODEL)",
        path.display()
    );
    path
}

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let gguf = Gguf::open(&model_path()).expect("open the reference model");
        Tokenizer::from_gguf(&gguf).expect("build the tokenizer")
    })
}

fn read_json(rel: &str) -> String {
    let path = shared_data(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn metadata() {
    let tok = tokenizer();
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(tok.bos_id(), 2);
    assert_eq!(tok.eos_id(), 1);
    assert_eq!(tok.token_id("<start_of_turn>"), Some(105));
    assert_eq!(tok.token_id("<end_of_turn>"), Some(106));
    assert_eq!(tok.token_kind(105), Some(TokenKind::Control));
    assert_eq!(tok.token_text(2), Some("<bos>"));
    assert_eq!(tok.token_id("no such piece"), None);
    assert_eq!(tok.token_kind(u32::MAX), None);
}

#[test]
fn reference_cases() {
    let tok = tokenizer();
    let text = read_json("tokenizer/gemma3-270m-reference-ids.jsonl");
    let mut failures = Vec::new();
    let mut cases = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case: Value = serde_json::from_str(line).expect("jsonl line");
        let name = case["name"].as_str().expect("name");
        let input = case["text"].as_str().expect("text");
        let add_bos = case["add_bos"].as_bool().expect("add_bos");
        let want = ids_of(&case["ids"]);
        cases += 1;
        let got = tok.encode(input, add_bos);
        if got != want {
            failures.push(format!("{name}:\n  want {want:?}\n  got  {got:?}"));
            continue;
        }
        // Decoding the reference ids gives the text back (control tokens render as nothing, so
        // cases that spell out chat markers are compared without them).
        let decoded = tok.decode(&want);
        let expected: String = if want
            .iter()
            .any(|&id| tok.token_kind(id) == Some(TokenKind::Control) && id != tok.bos_id())
        {
            input
                .replace("<start_of_turn>", "")
                .replace("<end_of_turn>", "")
        } else {
            input.to_string()
        };
        if decoded != expected {
            failures.push(format!(
                "{name}: decode gave {decoded:?}, want {expected:?}"
            ));
        }
    }
    assert_eq!(cases, 56, "expected 56 reference cases");
    assert!(
        failures.is_empty(),
        "{} of {cases} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn literal_encoding_spells_out_control_tokens() {
    let tok = tokenizer();
    let text = "<start_of_turn>user\nHi<end_of_turn>\n";
    let ids = tok.encode_literal(text, false);
    assert!(
        ids.iter()
            .all(|&id| tok.token_kind(id) != Some(TokenKind::Control)),
        "{ids:?}"
    );
    // User-defined pieces are still whole: the newline is its own token.
    assert!(ids.contains(&tok.token_id("\n").unwrap()));
    assert_eq!(tok.decode(&ids), text);
    assert_eq!(tok.encode(text, false)[0], 105);
}

#[test]
fn reference_files() {
    let tok = tokenizer();
    let refs: Value =
        serde_json::from_str(&read_json("tokenizer/gemma3-270m-reference-files.json"))
            .expect("json");
    let refs = refs.as_object().expect("object");
    assert_eq!(refs.len(), 2);
    for (rel, want) in refs {
        let path = shared_data(rel);
        let bytes =
            std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let text = String::from_utf8(bytes).expect("evaluation file is UTF-8");
        let t0 = Instant::now();
        let ids = tok.encode(&text, true);
        let secs = t0.elapsed().as_secs_f64();
        eprintln!(
            "{rel}: {} bytes -> {} tokens in {secs:.3} s",
            text.len(),
            ids.len()
        );
        assert_eq!(
            ids.len() as u64,
            want["n_tokens_with_bos"].as_u64().unwrap(),
            "{rel}: token count"
        );
        assert_eq!(
            ids[..64],
            ids_of(&want["first_64"])[..],
            "{rel}: first 64 ids"
        );
        assert_eq!(
            ids[ids.len() - 64..],
            ids_of(&want["last_64"])[..],
            "{rel}: last 64 ids"
        );
        let sum: u64 = ids.iter().map(|&id| u64::from(id)).sum();
        assert_eq!(
            sum,
            want["sum_of_ids"].as_u64().unwrap(),
            "{rel}: sum of ids"
        );
        assert_eq!(tok.decode(&ids), text, "{rel}: decode round trip");
    }
}

#[test]
fn stream_decoder_joins_split_utf8() {
    let tok = tokenizer();
    // U+1D518 MATHEMATICAL FRAKTUR CAPITAL U has no piece: it is four byte tokens.
    let text = "x𝔘y";
    let ids = tok.encode(text, false);
    assert_eq!(ids.len(), 6, "{ids:?}");
    let mut stream = tok.stream_decoder();
    let pieces: Vec<String> = ids.iter().map(|&id| stream.push(id)).collect();
    assert_eq!(pieces, ["x", "", "", "", "𝔘", "y"]);
    assert_eq!(stream.finish(), "");

    // Byte tokens built by hand: 'é' (C3 A9), then a lone continuation byte, then a truncated
    // three-byte character at the end.
    let byte = |b: u8| tok.token_id(&format!("<0x{b:02X}>")).unwrap();
    let ids = [byte(0xC3), byte(0xA9), byte(0xA9), byte(0xE2), byte(0x82)];
    let mut stream = tok.stream_decoder();
    let mut out: String = ids.iter().map(|&id| stream.push(id)).collect();
    out.push_str(&stream.finish());
    assert_eq!(out, "é\u{FFFD}\u{FFFD}");
    assert_eq!(out, tok.decode(&ids));
}

#[test]
fn decode_skips_invalid_and_control_ids() {
    let tok = tokenizer();
    let mut ids = tok.encode("Hello world", true);
    ids.insert(1, u32::MAX);
    ids.push(tok.vocab_size() as u32);
    ids.push(tok.eos_id());
    assert_eq!(tok.decode(&ids), "Hello world");
    assert!(tok.token_bytes(u32::MAX).is_empty());
    let mut stream = tok.stream_decoder();
    let out: String = ids.iter().map(|&id| stream.push(id)).collect();
    assert_eq!(out, "Hello world");
}

#[test]
fn stream_matches_decode_on_reference_cases() {
    let tok = tokenizer();
    let text = read_json("tokenizer/gemma3-270m-reference-ids.jsonl");
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case: Value = serde_json::from_str(line).expect("jsonl line");
        let ids = ids_of(&case["ids"]);
        let mut stream = tok.stream_decoder();
        let mut out: String = ids.iter().map(|&id| stream.push(id)).collect();
        out.push_str(&stream.finish());
        assert_eq!(out, tok.decode(&ids), "{}", case["name"]);
    }
}

#[test]
fn rejects_bad_metadata() {
    let mut gguf = Gguf::open(&model_path()).expect("open the reference model");
    let original = gguf.metadata.clone();
    let error = |gguf: &Gguf| match Tokenizer::from_gguf(gguf) {
        Ok(_) => panic!("tokenizer built from bad metadata"),
        Err(e) => e.to_string(),
    };

    gguf.metadata
        .insert("tokenizer.ggml.model".into(), MetaValue::Str("gpt2".into()));
    let e = error(&gguf);
    assert!(
        e.contains("tokenizer.ggml.model") && e.contains("gpt2"),
        "{e}"
    );

    gguf.metadata = original.clone();
    gguf.metadata.remove("tokenizer.ggml.scores");
    let e = error(&gguf);
    assert!(
        e.contains("tokenizer.ggml.scores") && e.contains("missing"),
        "{e}"
    );

    gguf.metadata = original.clone();
    if let Some(MetaValue::Array(types)) = gguf.metadata.get_mut("tokenizer.ggml.token_type") {
        types.pop();
    }
    let e = error(&gguf);
    assert!(
        e.contains("tokenizer.ggml.token_type") && e.contains("262143"),
        "{e}"
    );

    gguf.metadata = original;
    if let Some(MetaValue::Array(tokens)) = gguf.metadata.get_mut("tokenizer.ggml.tokens") {
        tokens[1000] = tokens[1001].clone();
    }
    let e = error(&gguf);
    assert!(e.contains("appears twice"), "{e}");
}
