//! kvq's perplexity on the reference model agrees with llama.cpp's `llama-perplexity` (commit
//! 0c1e570, 2 threads, 16-bit cache) on the same file and settings: after 4 chunks of 512 tokens
//! llama.cpp reports a running perplexity of 14.99 on ../shared/data/wikitext-2-raw/wiki.test.raw
//! (17.03 after 8, 17.77 after 64).

use kvq_cache::{CacheOptions, Policy};
use kvq_codec::{Calibration, KvSpec};
use kvq_eval::{perplexity, PplOptions};
use kvq_model::gemma3::Gemma3;
use kvq_model::gguf::Gguf;
use kvq_model::tokenizer::Tokenizer;
use std::path::PathBuf;

#[test]
fn four_chunks_of_wikitext_match_llama_cpp_within_one_percent() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let model = kvq_model::reference_model_path();
    assert!(
        model.exists(),
        "reference model missing at {}: run scripts/setup-model.sh",
        model.display()
    );
    let g = Gguf::open(&model).unwrap();
    let (m, tok) = (Gemma3::load(&g).unwrap(), Tokenizer::from_gguf(&g).unwrap());
    let text =
        std::fs::read_to_string(root.join("../shared/data/wikitext-2-raw/wiki.test.raw")).unwrap();
    // Only the first 4 chunks (2048 tokens) are scored; tokenize a prefix that covers them.
    let tokens = tok.encode(&text[..20_000], true);
    assert!(tokens.len() >= 4 * 512);
    let layers = m.config.layers;
    let opts = PplOptions {
        ctx: 512,
        chunks: 4,
        policy: Policy::uniform(KvSpec::parse("f16").unwrap(), layers),
        calibration: vec![(Calibration::default(), Calibration::default()); layers],
        cache: CacheOptions::default(),
    };
    let report = perplexity(&m, &tokens, tok.bos_id(), &opts, |_, _| {}).unwrap();
    assert_eq!(report.tokens, 4 * 255);
    let llama_cpp = 14.99;
    let rel = (report.ppl - llama_cpp).abs() / llama_cpp;
    assert!(
        rel < 0.01,
        "kvq {:.4} vs llama.cpp {llama_cpp}: {:.2}% apart",
        report.ppl,
        rel * 100.0
    );
}
