//! The SentencePiece ("llama"-model) tokenizer stored in GGUF metadata, giving exactly the ids of
//! llama.cpp's `llama-tokenize`.
//!
//! # Encoding
//!
//! 1. **Special-token partition.** The text is cut around occurrences of the vocabulary's special
//!    pieces, which become their token directly. Which pieces count: user-defined tokens (type 4:
//!    Gemma's newline/space/tab runs and HTML tags) always, and control/unknown tokens (types 3
//!    and 2: `<start_of_turn>`, `<bos>`, …) only when special parsing is on ([`Tokenizer::encode`];
//!    [`Tokenizer::encode_literal`] leaves them as plain text). Like llama.cpp, pieces are taken
//!    longest first (ties: lower id first); each piece claims its leftmost non-overlapping
//!    occurrences in the text not yet claimed by an earlier piece. A byte trie finds which
//!    pieces occur at all, so only those are searched for.
//! 2. **Whitespace escape.** In each remaining text fragment every space becomes U+2581 `▁`
//!    (with `add_space_prefix`, a `▁` is also put before a fragment that starts the text or
//!    follows a special token; Gemma has it off).
//! 3. **Score-driven merging.** The fragment is split into UTF-8 characters; a max-heap holds
//!    every adjacent pair whose concatenation is a vocabulary piece, keyed by that piece's score
//!    (ties: leftmost pair). The best pair is merged, its new neighbours are pushed, and stale
//!    heap entries (whose symbols changed since) are skipped — O(n log n) per fragment.
//! 4. **Byte fallback.** A final symbol that is a vocabulary piece is its token; any other (a
//!    character the vocabulary lacks) becomes one `<0xXX>` token per UTF-8 byte.
//!
//! # Decoding
//!
//! Normal pieces decode with `▁` turned back into spaces, user-defined pieces verbatim, byte
//! tokens as their byte, and control, unknown and unused tokens as nothing (llama.cpp's
//! rendering with `special = false`). Byte tokens can split one character across several
//! tokens; [`StreamDecoder`] holds such partial UTF-8 back until it completes.

use crate::gguf::{Gguf, GgufError, Value};
use std::collections::{BinaryHeap, HashMap};

/// U+2581, SentencePiece's stand-in for a space.
const SPACE_MARK: &str = "\u{2581}";

/// What a vocabulary entry is (GGUF `tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// An ordinary piece (type 1).
    Normal,
    /// The unknown-token marker (type 2).
    Unknown,
    /// A control token such as `<bos>` or `<start_of_turn>` (type 3).
    Control,
    /// A user-defined piece, always matched whole in text (type 4).
    UserDefined,
    /// A reserved, unused slot (type 5).
    Unused,
    /// A byte-fallback token `<0xXX>` (type 6).
    Byte,
    /// Any other type value (0 "undefined" or unknown codes); decodes to nothing.
    Undefined,
}

impl TokenKind {
    fn from_code(code: i64) -> Self {
        match code {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }
}

/// A SentencePiece tokenizer built from GGUF metadata. See the module docs for the algorithm.
pub struct Tokenizer {
    /// Vocabulary text per id.
    pieces: Vec<String>,
    /// Merge score per id.
    scores: Vec<f32>,
    /// Kind per id.
    kinds: Vec<TokenKind>,
    /// Piece text to id.
    ids: HashMap<String, u32>,
    /// Longest piece, in bytes (longer candidate merges are not looked up).
    max_piece_len: usize,
    /// Special pieces (user-defined, control, unknown) in partition order: longest first, then
    /// by id.
    specials: Vec<u32>,
    /// Byte trie over the special pieces, to find which of them occur in a text.
    trie: Trie,
    /// Token for each byte value in byte fallback.
    byte_ids: [u32; 256],
    bos: u32,
    eos: u32,
    add_space_prefix: bool,
}

fn meta_error(key: &str, problem: impl Into<String>) -> GgufError {
    GgufError::Metadata {
        key: key.to_string(),
        problem: problem.into(),
    }
}

/// The byte of a piece spelled `<0xXX>`.
fn parse_byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata. Fails when the model is not a
    /// SentencePiece (`"llama"`) tokenizer, when the tokens, scores or token-type arrays are
    /// missing, mistyped or of different lengths, when a piece appears twice, when a byte token
    /// is not spelled `<0xXX>`, or when a special-token id is out of range.
    pub fn from_gguf(gguf: &Gguf) -> Result<Self, GgufError> {
        const MODEL: &str = "tokenizer.ggml.model";
        const TOKENS: &str = "tokenizer.ggml.tokens";
        const SCORES: &str = "tokenizer.ggml.scores";
        const TYPES: &str = "tokenizer.ggml.token_type";

        let model = gguf.get_str(MODEL)?;
        if model != "llama" {
            return Err(meta_error(
                MODEL,
                format!("is {model:?}; kvq's tokenizer supports only SentencePiece (\"llama\")"),
            ));
        }
        let tokens = gguf.get_array(TOKENS)?;
        let scores = gguf.get_array(SCORES)?;
        let types = gguf.get_array(TYPES)?;
        let n = tokens.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(meta_error(TOKENS, format!("holds {n} tokens")));
        }
        for (key, len) in [(SCORES, scores.len()), (TYPES, types.len())] {
            if len != n {
                return Err(meta_error(
                    key,
                    format!("has {len} entries but {TOKENS} has {n}"),
                ));
            }
        }

        let mut pieces = Vec::with_capacity(n);
        let mut score_vec = Vec::with_capacity(n);
        let mut kinds = Vec::with_capacity(n);
        let mut ids = HashMap::with_capacity(n);
        for (i, ((tok, score), ty)) in tokens.iter().zip(scores).zip(types).enumerate() {
            let Value::Str(piece) = tok else {
                return Err(meta_error(TOKENS, format!("entry {i} is not a string")));
            };
            let score = match score {
                Value::Float(f) => *f as f32,
                Value::Int(v) => *v as f32,
                _ => return Err(meta_error(SCORES, format!("entry {i} is not a number"))),
            };
            let Value::Int(code) = ty else {
                return Err(meta_error(TYPES, format!("entry {i} is not an integer")));
            };
            let kind = TokenKind::from_code(*code);
            if kind == TokenKind::Byte && parse_byte_piece(piece).is_none() {
                return Err(meta_error(
                    TOKENS,
                    format!("byte token {i} is {piece:?}, not <0xXX>"),
                ));
            }
            // An empty piece can never match text; leave it out of the lookup.
            if !piece.is_empty() && ids.insert(piece.clone(), i as u32).is_some() {
                return Err(meta_error(TOKENS, format!("piece {piece:?} appears twice")));
            }
            pieces.push(piece.clone());
            score_vec.push(score);
            kinds.push(kind);
        }

        let id_key = |key: &str, default: u32| -> Result<u32, GgufError> {
            match gguf.metadata.get(key) {
                None => Ok(default),
                Some(_) => {
                    let id = gguf.get_usize(key)?;
                    if id >= n {
                        return Err(meta_error(
                            key,
                            format!("id {id} is outside the {n}-token vocabulary"),
                        ));
                    }
                    Ok(id as u32)
                }
            }
        };
        // Defaults are llama.cpp's for SentencePiece vocabularies.
        let bos = id_key("tokenizer.ggml.bos_token_id", 1)?;
        let eos = id_key("tokenizer.ggml.eos_token_id", 2)?;
        let unk = id_key("tokenizer.ggml.unknown_token_id", 0)?;
        let add_space_prefix = match gguf.metadata.get("tokenizer.ggml.add_space_prefix") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(meta_error(
                    "tokenizer.ggml.add_space_prefix",
                    "is not a bool",
                ))
            }
        };

        // Byte fallback: `<0xXX>`, else the one-byte piece (ASCII), else the unknown token.
        let mut byte_ids = [unk; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let found = ids.get(format!("<0x{b:02X}>").as_str()).or_else(|| {
                let c = char::from(b as u8);
                if c.is_ascii() {
                    ids.get(c.to_string().as_str())
                } else {
                    None
                }
            });
            if let Some(&id) = found {
                *slot = id;
            }
        }

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                let kind = kinds[i as usize];
                let special = matches!(
                    kind,
                    TokenKind::UserDefined | TokenKind::Control | TokenKind::Unknown
                );
                special && !pieces[i as usize].is_empty()
            })
            .collect();
        specials.sort_by_key(|&i| (std::cmp::Reverse(pieces[i as usize].len()), i));
        let mut trie = Trie::default();
        for (rank, &id) in specials.iter().enumerate() {
            trie.insert(pieces[id as usize].as_bytes(), rank);
        }

        let max_piece_len = pieces.iter().map(String::len).max().unwrap_or(0);
        Ok(Self {
            pieces,
            scores: score_vec,
            kinds,
            ids,
            max_piece_len,
            specials,
            trie,
            byte_ids,
            bos,
            eos,
            add_space_prefix,
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The beginning-of-sequence token.
    pub fn bos_id(&self) -> u32 {
        self.bos
    }

    /// The end-of-sequence token.
    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    /// The id of the token whose vocabulary text is exactly `piece` (e.g. `"<start_of_turn>"`,
    /// or `"▁the"` for a normal piece), if any.
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.ids.get(piece).copied()
    }

    /// The raw vocabulary text of a token (spaces still as `▁`), or `None` for an invalid id.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(String::as_str)
    }

    /// The kind of a token, or `None` for an invalid id.
    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// Tokenizes `text` as llama.cpp's `llama-tokenize` does, with special-token parsing on: the
    /// text of a control token (`<start_of_turn>`, `<bos>`, …) becomes that token. Prepends BOS
    /// when `add_bos`. Use [`Tokenizer::encode_literal`] for untrusted text.
    pub fn encode(&self, text: &str, add_bos: bool) -> Vec<u32> {
        self.encode_impl(text, add_bos, true)
    }

    /// Like [`Tokenizer::encode`], but control-token text is spelled out with ordinary pieces
    /// (llama.cpp's `parse_special = false`), so user content cannot inject `<end_of_turn>`.
    /// User-defined pieces (whitespace runs, HTML tags) are still matched whole.
    pub fn encode_literal(&self, text: &str, add_bos: bool) -> Vec<u32> {
        self.encode_impl(text, add_bos, false)
    }

    fn encode_impl(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            out.push(self.bos);
        }
        let mut merger = Merger::default();
        let mut escaped = String::new();
        let mut prev_special = true;
        let mut pos = 0;
        let mut encode_text = |out: &mut Vec<u32>, fragment: &str, prev_special: bool| {
            escaped.clear();
            if self.add_space_prefix && prev_special {
                escaped.push_str(SPACE_MARK);
            }
            for (i, part) in fragment.split(' ').enumerate() {
                if i > 0 {
                    escaped.push_str(SPACE_MARK);
                }
                escaped.push_str(part);
            }
            merger.encode(self, &escaped, out);
        };
        for (start, id) in self.partition(text, parse_special) {
            if start > pos {
                encode_text(&mut out, &text[pos..start], prev_special);
            }
            out.push(id);
            prev_special = true;
            pos = start + self.pieces[id as usize].len();
        }
        if pos < text.len() {
            encode_text(&mut out, &text[pos..], prev_special);
        }
        out
    }

    /// The special tokens cut out of `text`, as (byte offset, id) in text order.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<(usize, u32)> {
        let allowed = |rank: usize| {
            parse_special || self.kinds[self.specials[rank] as usize] == TokenKind::UserDefined
        };
        let mut present: Vec<usize> = self
            .trie
            .occurring(text.as_bytes())
            .into_iter()
            .filter(|&r| allowed(r))
            .collect();
        present.sort_unstable();
        // Unclaimed text as (start, end) ranges, and the special tokens found so far.
        let mut free = vec![(0, text.len())];
        let mut found = Vec::new();
        for rank in present {
            let id = self.specials[rank];
            let piece = self.pieces[id as usize].as_str();
            let mut next_free = Vec::with_capacity(free.len());
            for &(start, end) in &free {
                let mut from = start;
                for (offset, _) in text[start..end].match_indices(piece) {
                    let at = start + offset;
                    if at > from {
                        next_free.push((from, at));
                    }
                    found.push((at, id));
                    from = at + piece.len();
                }
                if from < end {
                    next_free.push((from, end));
                }
            }
            free = next_free;
        }
        found.sort_unstable();
        found
    }

    /// Appends the bytes token `id` decodes to (see the module docs); invalid ids add nothing.
    fn push_token_bytes(&self, id: u32, out: &mut Vec<u8>) {
        let Some(piece) = self.pieces.get(id as usize) else {
            return;
        };
        match self.kinds[id as usize] {
            TokenKind::Normal => {
                for (i, part) in piece.split(SPACE_MARK).enumerate() {
                    if i > 0 {
                        out.push(b' ');
                    }
                    out.extend_from_slice(part.as_bytes());
                }
            }
            TokenKind::UserDefined => out.extend_from_slice(piece.as_bytes()),
            TokenKind::Byte => out.extend(parse_byte_piece(piece)),
            TokenKind::Control | TokenKind::Unknown | TokenKind::Unused | TokenKind::Undefined => {}
        }
    }

    /// The bytes one token decodes to. A byte token gives one byte, which may be part of a
    /// multi-byte character; control, unknown and unused tokens and invalid ids give nothing.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let mut out = Vec::new();
        self.push_token_bytes(id, &mut out);
        out
    }

    /// Decodes ids to text. Invalid ids (≥ [`Tokenizer::vocab_size`]) and control, unknown and
    /// unused tokens are skipped; byte sequences that are not valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            self.push_token_bytes(id, &mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// A decoder for tokens arriving one at a time.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            pending: Vec::new(),
        }
    }
}

/// Incremental decoding for generation: [`StreamDecoder::push`] returns the text each token
/// completes, holding back the start of a character split across byte tokens. The
/// concatenated output equals [`Tokenizer::decode`] of all the ids pushed.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    /// Bytes of an incomplete UTF-8 character.
    pending: Vec<u8>,
}

impl StreamDecoder<'_> {
    /// Adds one token and returns the text it completes (possibly empty). Invalid byte
    /// sequences come out as U+FFFD as soon as they are known to be invalid.
    pub fn push(&mut self, id: u32) -> String {
        self.tokenizer.push_token_bytes(id, &mut self.pending);
        let mut text = String::new();
        let mut rest = 0;
        loop {
            match std::str::from_utf8(&self.pending[rest..]) {
                Ok(s) => {
                    text.push_str(s);
                    rest = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = rest + e.valid_up_to();
                    // The prefix up to `valid` was just validated, so this is lossless.
                    text.push_str(&String::from_utf8_lossy(&self.pending[rest..valid]));
                    match e.error_len() {
                        Some(bad) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = valid + bad;
                        }
                        None => {
                            rest = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..rest);
        text
    }

    /// Ends the stream: an incomplete character still held back comes out as U+FFFD.
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}

/// A byte trie over the special pieces, each end node holding the piece's partition rank.
#[derive(Default)]
struct Trie {
    /// Node 0 is the root. Children as (byte, node) pairs.
    children: Vec<Vec<(u8, u32)>>,
    /// Rank ending at each node.
    rank: Vec<Option<usize>>,
}

impl Trie {
    fn insert(&mut self, key: &[u8], rank: usize) {
        if self.children.is_empty() {
            self.children.push(Vec::new());
            self.rank.push(None);
        }
        let mut node = 0;
        for &b in key {
            node = match self.children[node].iter().find(|&&(c, _)| c == b) {
                Some(&(_, next)) => next as usize,
                None => {
                    let next = self.children.len();
                    self.children.push(Vec::new());
                    self.rank.push(None);
                    self.children[node].push((b, next as u32));
                    next
                }
            };
        }
        self.rank[node] = Some(rank);
    }

    /// The distinct ranks of all pieces occurring anywhere in `text`.
    fn occurring(&self, text: &[u8]) -> Vec<usize> {
        let Some(root) = self.children.first() else {
            return Vec::new();
        };
        let mut first = [false; 256];
        for &(b, _) in root {
            first[b as usize] = true;
        }
        let mut seen = vec![false; self.rank.len()];
        let mut ranks = Vec::new();
        for start in 0..text.len() {
            if !first[text[start] as usize] {
                continue;
            }
            let mut node = 0;
            for &b in &text[start..] {
                match self.children[node].iter().find(|&&(c, _)| c == b) {
                    Some(&(_, next)) => node = next as usize,
                    None => break,
                }
                if let Some(rank) = self.rank[node] {
                    if !seen[node] {
                        seen[node] = true;
                        ranks.push(rank);
                    }
                }
            }
        }
        ranks
    }
}

/// One symbol of the merge: a byte range of the escaped text, linked to its live neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

/// A candidate merge of symbols `left` and `right` into a piece of `size` bytes.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bigram {
    /// Higher score first; on a tie, the leftmost pair.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

const NONE: usize = usize::MAX;

/// Scratch space for the merge, reused across fragments.
#[derive(Default)]
struct Merger {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Bigram>,
}

impl Merger {
    /// Tokenizes one escaped fragment, appending to `out`.
    fn encode(&mut self, tok: &Tokenizer, text: &str, out: &mut Vec<u32>) {
        self.symbols.clear();
        self.heap.clear();
        for (start, c) in text.char_indices() {
            let index = self.symbols.len();
            self.symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: index.wrapping_sub(1),
                next: index + 1,
            });
        }
        let Some(last) = self.symbols.last_mut() else {
            return;
        };
        last.next = NONE;
        for right in 1..self.symbols.len() {
            self.try_push(tok, text, right - 1, right);
        }
        while let Some(bigram) = self.heap.pop() {
            let (left, right) = (self.symbols[bigram.left], self.symbols[bigram.right]);
            // Skip stale candidates: a side was merged away or has grown since.
            if left.len == 0 || right.len == 0 || left.len + right.len != bigram.size {
                continue;
            }
            self.symbols[bigram.left].len += right.len;
            self.symbols[bigram.left].next = right.next;
            self.symbols[bigram.right].len = 0;
            if right.next != NONE {
                self.symbols[right.next].prev = bigram.left;
            }
            self.try_push(tok, text, left.prev, bigram.left);
            self.try_push(tok, text, bigram.left, right.next);
        }
        let mut i = 0;
        while i != NONE {
            let sym = self.symbols[i];
            let piece = &text[sym.start..sym.start + sym.len];
            match tok.ids.get(piece) {
                Some(&id) => out.push(id),
                None => out.extend(piece.bytes().map(|b| tok.byte_ids[b as usize])),
            }
            i = sym.next;
        }
    }

    /// Queues the merge of `left` and `right` if their concatenation is a vocabulary piece.
    fn try_push(&mut self, tok: &Tokenizer, text: &str, left: usize, right: usize) {
        if left == NONE || right == NONE {
            return;
        }
        let start = self.symbols[left].start;
        let size = self.symbols[left].len + self.symbols[right].len;
        if size > tok.max_piece_len {
            return;
        }
        if let Some(&id) = tok.ids.get(&text[start..start + size]) {
            self.heap.push(Bigram {
                score: tok.scores[id as usize],
                left,
                right,
                size,
            });
        }
    }
}
