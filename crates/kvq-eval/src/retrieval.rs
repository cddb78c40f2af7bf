//! Passkey retrieval: a random 5-digit pass key hidden at a chosen depth of a long prose
//! haystack, asked for at the end, answered by greedy decoding with the cache in the loop.

use crate::perplexity::CacheSetup;
use kvq_model::gemma3::Gemma3;
use kvq_model::sampler::argmax;
use kvq_model::tokenizer::Tokenizer;
use kvq_model::ModelError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::PREFILL_TOKENS;

/// Tokens generated after the question (the key is 5 digits, one token each, plus a space).
pub const ANSWER_TOKENS: usize = 8;

// Gemma's chat turns: the reference model answers with the digits only when asked in a user
// turn and when the answer is started for it ("The 5-digit pass key is").
const INTRO: &str = "<start_of_turn>user\nThere is a pass key hidden inside a lot of irrelevant \
                     text. Find it and memorize it. I will quiz you about the pass key.\n\n";
const QUESTION: &str = "\n\nWhat is the 5-digit pass key?<end_of_turn>\n<start_of_turn>model\n\
                        The 5-digit pass key is";

/// The sentence that hides `passkey` in the haystack.
fn needle(passkey: u32) -> String {
    format!("\nThe pass key is {passkey}. Remember it. {passkey} is the pass key.\n")
}

/// A retrieval prompt of a given length.
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    /// The prompt's tokens, BOS first.
    pub tokens: Vec<u32>,
    /// Token index at which the needle starts.
    pub needle_at: usize,
    /// Tokens of filler prose (the haystack) in the prompt.
    pub filler: usize,
}

/// Builds a prompt of exactly `length` tokens: an instruction, `haystack` prose with the
/// needle placed after `depth_percent`% of the prose (0: before it, 100: after it), and the
/// question. `haystack` is the tokenized prose (no BOS); it repeats when too short. `None`
/// when `length` cannot hold the instruction, needle and question.
pub fn build_prompt(
    tokenizer: &Tokenizer,
    haystack: &[u32],
    length: usize,
    depth_percent: f64,
    passkey: u32,
) -> Option<Prompt> {
    // The fixed parts are ours, so their turn markers are parsed; the prose is not.
    let intro = tokenizer.encode(INTRO, true);
    let needle = tokenizer.encode_literal(&needle(passkey), false);
    let question = tokenizer.encode(QUESTION, false);
    let fixed = intro.len() + needle.len() + question.len();
    let filler = length.checked_sub(fixed)?;
    if haystack.is_empty() && filler > 0 {
        return None;
    }
    let before = ((depth_percent.clamp(0.0, 100.0) / 100.0) * filler as f64).round() as usize;
    let prose = haystack.iter().copied().cycle();
    let mut tokens = intro;
    tokens.extend(prose.clone().take(before));
    let needle_at = tokens.len();
    tokens.extend(needle);
    tokens.extend(prose.skip(before).take(filler - before));
    tokens.extend(question);
    Some(Prompt {
        tokens,
        needle_at,
        filler,
    })
}

/// The first run of ASCII digits in `text`, if any.
pub fn first_number(text: &str) -> Option<&str> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let rest = &text[start..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Whether a generated answer names `passkey`: its first number is exactly the key.
pub fn answer_is_correct(answer: &str, passkey: u32) -> bool {
    first_number(answer) == Some(passkey.to_string().as_str())
}

/// `trials` seeded random 5-digit pass keys.
pub fn passkeys(seed: u64, trials: usize) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..trials)
        .map(|_| rng.gen_range(10_000..100_000))
        .collect()
}

/// Prefills `prompt` into a fresh cache built from `setup` and greedily decodes
/// [`ANSWER_TOKENS`] tokens; returns their text.
pub fn answer(
    model: &Gemma3,
    tokenizer: &Tokenizer,
    setup: &CacheSetup,
    prompt: &[u32],
) -> Result<String, ModelError> {
    let total = prompt.len() + ANSWER_TOKENS;
    let mut cache = setup.build(model, total, PREFILL_TOKENS)?;
    let seq = cache.add_sequence();
    let mut hidden = Vec::new();
    for chunk in prompt.chunks(PREFILL_TOKENS) {
        hidden = model.forward(&mut cache, seq, chunk, chunk.len() - 1)?;
    }
    let mut out = Vec::with_capacity(ANSWER_TOKENS);
    for i in 0..ANSWER_TOKENS {
        let next = argmax(&model.logits(&hidden));
        out.push(next);
        if i + 1 < ANSWER_TOKENS {
            hidden = model.forward(&mut cache, seq, &[next], 0)?;
        }
    }
    Ok(tokenizer.decode(&out))
}

/// Accuracy of one scheme at one length and depth.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cell {
    /// Prompt length in tokens.
    pub length: usize,
    /// Needle depth in percent of the haystack.
    pub depth: f64,
    /// Trials run.
    pub trials: usize,
    /// Trials answered with the right key.
    pub correct: usize,
}

impl Cell {
    /// Share of trials answered correctly.
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.trials.max(1) as f64
    }
}

/// Settings of a retrieval run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RetrievalOptions {
    /// Prompt lengths in tokens.
    pub lengths: Vec<usize>,
    /// Needle depths in percent.
    pub depths: Vec<f64>,
    /// Trials (pass keys) per length and depth.
    pub trials: usize,
    /// Seed of the pass keys.
    pub seed: u64,
}

/// Runs every setup on every (length, depth, trial) prompt; returns one list of cells per
/// setup, in `lengths` × `depths` order. `on_answer` is called after every answer with the
/// setup's index, the cell and whether the answer was right.
pub fn retrieval(
    model: &Gemma3,
    tokenizer: &Tokenizer,
    haystack: &[u32],
    setups: &[CacheSetup],
    opts: &RetrievalOptions,
    mut on_answer: impl FnMut(usize, &Cell, bool),
) -> Result<Vec<Vec<Cell>>, ModelError> {
    let keys = passkeys(opts.seed, opts.trials);
    let mut cells = vec![Vec::new(); setups.len()];
    for &length in &opts.lengths {
        for &depth in &opts.depths {
            for per_setup in cells.iter_mut() {
                per_setup.push(Cell {
                    length,
                    depth,
                    trials: 0,
                    correct: 0,
                });
            }
            for &key in &keys {
                let prompt = build_prompt(tokenizer, haystack, length, depth, key).ok_or(
                    ModelError::ContextOverflow {
                        tokens: length,
                        context_length: model.config.context_length,
                    },
                )?;
                for (i, setup) in setups.iter().enumerate() {
                    let text = answer(model, tokenizer, setup, &prompt.tokens)?;
                    let ok = answer_is_correct(&text, key);
                    let cell = cells[i].last_mut().expect("cell pushed above");
                    cell.trials += 1;
                    cell.correct += usize::from(ok);
                    on_answer(i, cell, ok);
                }
            }
        }
    }
    Ok(cells)
}

/// A sentence on where the baseline (the 16-bit cache) retrieves: the cells where it fails,
/// and the lengths at which it answers every trial at every depth.
pub fn baseline_summary(cells: &[Cell]) -> String {
    let failing: Vec<String> = cells
        .iter()
        .filter(|c| c.correct < c.trials)
        .map(|c| {
            format!(
                "{} tokens at depth {}% ({}/{})",
                c.length, c.depth, c.correct, c.trials
            )
        })
        .collect();
    let mut lengths: Vec<usize> = cells.iter().map(|c| c.length).collect();
    lengths.dedup();
    let good: Vec<String> = lengths
        .iter()
        .filter(|&&l| {
            cells
                .iter()
                .filter(|c| c.length == l)
                .all(|c| c.correct == c.trials)
        })
        .map(|l| l.to_string())
        .collect();
    let works = if good.is_empty() {
        "at none of the lengths tried".to_string()
    } else {
        format!("at {} tokens", good.join(", "))
    };
    if failing.is_empty() {
        format!("The 16-bit cache retrieves every key at every length and depth tried ({works}).")
    } else {
        format!(
            "The 16-bit cache itself fails at {}; it retrieves every key at every depth {works}. \
             Scheme results where the baseline fails measure the model, not the cache.",
            failing.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_parsed_from_answers() {
        assert_eq!(first_number(" 48213. Remember"), Some("48213"));
        assert_eq!(first_number("no digits"), None);
        assert!(answer_is_correct(" 48213.", 48213));
        assert!(!answer_is_correct(" 482134", 48213));
        assert!(!answer_is_correct(" 4821", 48213));
        assert!(!answer_is_correct(" 12345 then 48213", 48213));
    }

    #[test]
    fn passkeys_are_seeded_five_digit_numbers() {
        let a = passkeys(7, 50);
        assert_eq!(a, passkeys(7, 50));
        assert_ne!(a, passkeys(8, 50));
        assert!(a.iter().all(|k| (10_000..100_000).contains(k)));
    }

    #[test]
    fn baseline_summary_names_failures_and_good_lengths() {
        let cell = |length, depth, correct| Cell {
            length,
            depth,
            trials: 2,
            correct,
        };
        let cells = [
            cell(1024, 0.0, 2),
            cell(1024, 50.0, 2),
            cell(4096, 0.0, 1),
            cell(4096, 50.0, 2),
        ];
        let s = baseline_summary(&cells);
        assert!(s.contains("fails at 4096 tokens at depth 0% (1/2)"), "{s}");
        assert!(s.contains("every depth at 1024 tokens"), "{s}");
        let all_good = baseline_summary(&cells[..2]);
        assert!(
            all_good.starts_with("The 16-bit cache retrieves every key"),
            "{all_good}"
        );
    }
}
