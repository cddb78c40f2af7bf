//! kvq-eval on the reference model: KL divergence against the 16-bit cache on one short chunk,
//! and retrieval prompts built with the real tokenizer.
//!
//! The model comes from `$KVQ_MODEL`, else `<workspace>/models/gemma-3-270m-q4_k_m.gguf`
//! (`scripts/setup-model.sh`). Run in release mode: `cargo test --release -p kvq-eval`.

use kvq_cache::{CacheOptions, Policy};
use kvq_codec::{Calibration, KvSpec};
use kvq_eval::retrieval::{answer, answer_is_correct, build_prompt};
use kvq_eval::{perplexity_many, CacheSetup};
use kvq_model::gemma3::Gemma3;
use kvq_model::gguf::Gguf;
use kvq_model::tokenizer::Tokenizer;
use std::sync::OnceLock;

fn model() -> &'static (Gemma3, Tokenizer) {
    static MODEL: OnceLock<(Gemma3, Tokenizer)> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = kvq_model::reference_model_path();
        assert!(
            path.exists(),
            "reference model not found at {}: run scripts/setup-model.sh (or set KVQ_MODEL)",
            path.display()
        );
        let g = Gguf::open(&path).expect("open the reference model");
        (Gemma3::load(&g).unwrap(), Tokenizer::from_gguf(&g).unwrap())
    })
}

fn setup(kv: &str, sinks: usize) -> CacheSetup {
    let layers = model().0.config.layers;
    CacheSetup {
        policy: Policy::uniform(KvSpec::parse(kv).unwrap(), layers),
        calibration: vec![(Calibration::default(), Calibration::default()); layers],
        options: CacheOptions {
            sink_tokens: sinks,
            ..CacheOptions::default()
        },
    }
}

const PROSE: &str = "It is a truth universally acknowledged, that a single man in possession of a \
    good fortune, must be in want of a wife. However little known the feelings or views of such a \
    man may be on his first entering a neighbourhood, this truth is so well fixed in the minds of \
    the surrounding families, that he is considered as the rightful property of some one or other \
    of their daughters. \"My dear Mr. Bennet,\" said his lady to him one day, \"have you heard \
    that Netherfield Park is let at last?\" Mr. Bennet replied that he had not. \"But it is,\" \
    returned she; \"for Mrs. Long has just been here, and she told me all about it.\"";

#[test]
fn kld_is_zero_against_itself_and_positive_for_q4_0() {
    let (model, tok) = model();
    let tokens = tok.encode(&PROSE.repeat(3), true);
    let ctx = 128;
    assert!(tokens.len() >= ctx);
    let reference = setup("f16", 0);
    // f16 again (reuses the reference's run), f16 with sink rows (a separate run of the same
    // 16-bit values), and q4_0.
    let schemes = [setup("f16", 0), setup("f16", 4), setup("q4_0", 0)];
    let r = perplexity_many(
        model,
        &tokens,
        tok.bos_id(),
        ctx,
        1,
        Some(&reference),
        &schemes,
        |_, _| {},
    )
    .unwrap();
    let scored = ctx - 1 - ctx / 2;
    for (i, rep) in r.iter().enumerate() {
        assert_eq!((rep.tokens, rep.chunks), (scored, 1), "scheme {i}");
    }
    let k: Vec<_> = r.iter().map(|x| x.kld.clone().unwrap()).collect();
    assert_eq!(k[0].kld_mean, 0.0);
    assert_eq!(k[0].top1_agree, 1.0);
    assert_eq!(r[0].ppl, k[0].ppl_reference);
    assert!(k[1].kld_mean < 1e-6 && k[1].top1_agree == 1.0, "{:?}", k[1]);
    assert!(k[2].kld_mean > 1e-4, "{:?}", k[2]);
    assert!(k[2].kld_p99 >= k[2].kld_mean && k[2].kld_max >= k[2].kld_p99);
    assert!(k[2].top1_agree < 1.0 + 1e-12 && k[2].top1_agree > 0.5);
    assert_ne!(r[2].ppl, r[0].ppl);
}

#[test]
fn retrieval_prompts_place_the_needle_at_the_requested_depth() {
    let (model, tok) = model();
    let hay = tok.encode_literal(PROSE, false);
    let needle_of =
        |p: &kvq_eval::retrieval::Prompt| tok.decode(&p.tokens[p.needle_at..p.needle_at + 12]);
    let mut at = Vec::new();
    for depth in [0.0, 50.0, 100.0] {
        let p = build_prompt(tok, &hay, 400, depth, 48213).unwrap();
        assert_eq!(p.tokens.len(), 400);
        assert_eq!(p.tokens[0], tok.bos_id());
        assert!(
            needle_of(&p).starts_with("\nThe pass key is 48213."),
            "{:?}",
            needle_of(&p)
        );
        at.push(p.needle_at);
    }
    // Depth 0: right after the instruction; 100: every filler token before it; 50: half way.
    let intro = at[0];
    let filler = build_prompt(tok, &hay, 400, 0.0, 48213).unwrap().filler;
    assert_eq!(at[2], intro + filler);
    assert_eq!(at[1], intro + (filler as f64 / 2.0).round() as usize);
    assert!(tok
        .decode(&build_prompt(tok, &hay, 400, 0.0, 48213).unwrap().tokens)
        .ends_with("The 5-digit pass key is"));
    assert!(build_prompt(tok, &hay, 20, 50.0, 48213).is_none());

    // The 16-bit cache retrieves the key from a short haystack.
    let p = build_prompt(tok, &hay, 300, 50.0, 48213).unwrap();
    let text = answer(model, tok, &setup("f16", 0), &p.tokens).unwrap();
    assert!(answer_is_correct(&text, 48213), "answer {text:?}");
}

#[test]
fn chunks_prefilled_in_pieces_score_as_one_forward_does() {
    // 640 tokens: a piece of PREFILL_TOKENS (512), then 128; the scored half starts inside
    // the first piece. The same chunk in one forward on a cache that takes it whole.
    let (model, tok) = model();
    let tokens = tok.encode(&PROSE.repeat(12), true);
    let ctx = 640;
    assert!(tokens.len() >= ctx && ctx > kvq_eval::PREFILL_TOKENS);
    let f16 = setup("f16", 0);
    let pieces = perplexity_many(
        model,
        &tokens,
        tok.bos_id(),
        ctx,
        1,
        None,
        std::slice::from_ref(&f16),
        |_, _| {},
    )
    .unwrap()
    .remove(0);
    let mut cache = f16.build(model, ctx, ctx).unwrap();
    let seq = cache.add_sequence();
    let mut batch = tokens[..ctx].to_vec();
    batch[0] = tok.bos_id();
    let first = ctx / 2;
    let hidden = model.forward(&mut cache, seq, &batch, first).unwrap();
    let (h, vocab) = (model.config.hidden, model.config.vocab);
    let nll: Vec<f64> = (0..ctx - 1 - first)
        .map(|i| {
            let row = model.logits(&hidden[i * h..(i + 1) * h]);
            assert_eq!(row.len(), vocab);
            let lse = kvq_eval::kld::log_sum_exp(&row);
            lse - f64::from(row[batch[first + i + 1] as usize])
        })
        .collect();
    assert_eq!(pieces.nll.len(), nll.len());
    // The model's prefill rounds differently at another batch size (its f32 products are
    // blocked by the batch): tokens of the first piece, whose inputs are the same either way,
    // move by up to 5e-3 (1.6e-4 on average, measured). A piece misplaced or a hidden state
    // taken from the wrong token moves them by whole nats.
    let moved: Vec<f64> = pieces
        .nll
        .iter()
        .zip(&nll)
        .map(|(a, b)| (a - b).abs())
        .collect();
    for (i, m) in moved.iter().enumerate() {
        assert!(*m < 2e-2, "token {i}: {} vs {}", pieces.nll[i], nll[i]);
    }
    assert!(moved.iter().sum::<f64>() / (moved.len() as f64) < 1e-3);
}
