//! [`Unigram`]: SentencePiece's unigram segmentation of normalised text, as the `sentencepiece` package ComfyUI
//! imports (0.2.3) computes it: the Viterbi best path over every normal or user-defined piece that matches
//! at each character, scores added in f32; a character no piece starts with costs the lowest normal score minus
//! 10 as the unknown piece; user-defined pieces score 0.1 per byte after the first; the accumulated score is
//! re-centred past ±100 000. Unknown characters become their UTF-8 bytes' `<0xXX>` pieces when the model has
//! them (byte fallback), else runs of them one unknown id.
//!
//! The invariant: every id returned is a piece of the model; `Unused`, `Control`, `Unknown` and `Byte` pieces are
//! never matched from text.

use std::collections::HashMap;

use super::normalize::one_char_len;
use super::proto::{Piece, PieceType};
use crate::error::{Error, Result};

/// What the lowest normal score is lowered by for an unknown character.
const UNK_PENALTY: f32 = 10.0;
/// The accumulated path score past which it is re-centred on 0 (SentencePiece's `score_reset_threshold_`).
const SCORE_RESET: f32 = 100_000.0;

/// A model's pieces, ready to segment.
#[derive(Debug, Clone)]
pub(crate) struct Unigram {
    /// The pieces text can match (`Normal` and `UserDefined`), by their bytes.
    matchable: HashMap<Box<[u8]>, u32>,
    /// The longest matchable piece, in bytes.
    longest: usize,
    /// Scores by id.
    scores: Vec<f32>,
    /// Whether each id is user-defined.
    user_defined: Vec<bool>,
    /// The score of an unknown character.
    unk_score: f32,
    /// The unknown piece's id, if the model has one.
    unk: Option<u32>,
    /// The id of `<0x00>`, when the model has the 256 byte pieces in order.
    bytes_start: Option<u32>,
}

/// A node of the best path: the best segmentation of the text up to a byte position ends with `id` (`None`:
/// an unknown character), which starts at `start`.
#[derive(Debug, Clone, Copy)]
struct Node {
    id: Option<u32>,
    score: f32,
    start: Option<usize>,
}

impl Unigram {
    /// The segmenter of `pieces`; [`Error::Tokenizer`] for an empty or repeated piece, byte pieces out of order,
    /// or a model with neither an unknown piece nor byte fallback.
    pub(crate) fn new(pieces: &[Piece]) -> Result<Unigram> {
        let bad = |msg: String| Error::Tokenizer(format!("the SentencePiece model: {msg}"));
        let mut all: HashMap<&str, u32> = HashMap::with_capacity(pieces.len());
        let mut matchable: HashMap<Box<[u8]>, u32> = HashMap::new();
        let mut unk = None;
        for (id, p) in pieces.iter().enumerate() {
            let id = u32::try_from(id).map_err(|_| bad("more than 2³² pieces".to_owned()))?;
            if p.piece.is_empty() {
                return Err(bad(format!("piece {id} is empty")));
            }
            if all.insert(&p.piece, id).is_some() {
                return Err(bad(format!("piece {:?} is defined twice", p.piece)));
            }
            match p.kind {
                PieceType::Normal | PieceType::UserDefined => {
                    matchable.insert(p.piece.as_bytes().into(), id);
                }
                PieceType::Unknown => unk = unk.or(Some(id)),
                PieceType::Control | PieceType::Unused | PieceType::Byte => {}
            }
        }
        let bytes_start = all.get("<0x00>").copied();
        if let Some(start) = bytes_start {
            for byte in 0..=255u32 {
                let piece = format!("<0x{byte:02X}>");
                if all.get(piece.as_str()) != Some(&(start + byte)) {
                    return Err(bad(format!("byte piece {piece} is not at id {}", start + byte)));
                }
            }
        }
        if unk.is_none() && bytes_start.is_none() {
            return Err(bad("it has no unknown piece and no byte pieces".to_owned()));
        }
        let normal = pieces.iter().filter(|p| p.kind == PieceType::Normal);
        let min_score = normal.map(|p| p.score).fold(f32::MAX, f32::min);
        Ok(Unigram {
            longest: matchable.keys().map(|k| k.len()).max().unwrap_or(0),
            matchable,
            scores: pieces.iter().map(|p| p.score).collect(),
            user_defined: pieces.iter().map(|p| p.kind == PieceType::UserDefined).collect(),
            unk_score: min_score - UNK_PENALTY,
            unk,
            bytes_start,
        })
    }

    /// The ids of normalised text.
    pub(crate) fn encode(&self, text: &[u8]) -> Vec<u32> {
        let size = text.len();
        let mut best = vec![Node { id: None, score: 0.0, start: None }; size + 1];
        let mut frontier = 0;
        let mut start = 0;
        while start < size {
            let mut here = best[start].score;
            if !(-SCORE_RESET..=SCORE_RESET).contains(&here) {
                for (i, node) in best.iter_mut().enumerate().take(frontier + 1).skip(start) {
                    if i == start || node.start.is_some() {
                        node.score -= here;
                    }
                }
                here = 0.0;
            }
            let char_len = one_char_len(text[start]).min(size - start);
            let mut single = false;
            for len in 1..=self.longest.min(size - start) {
                let Some(&id) = self.matchable.get(&text[start..start + len]) else { continue };
                let end = start + len;
                frontier = frontier.max(end);
                let score = if self.user_defined[id as usize] {
                    0.1f32 * (len as i32 - 1) as f32
                } else {
                    self.scores[id as usize]
                };
                relax(&mut best[end], Some(id), score + here, start);
                single |= len == char_len;
            }
            if !single {
                let end = start + char_len;
                frontier = frontier.max(end);
                relax(&mut best[end], None, self.unk_score + here, start);
            }
            start += char_len;
        }
        let mut path = Vec::new();
        let mut end = size;
        while end > 0 {
            let node = best[end];
            let begin = node.start.unwrap_or(0);
            path.push((node.id, &text[begin..end]));
            end = begin;
        }
        let mut ids = Vec::with_capacity(path.len());
        for (id, piece) in path.into_iter().rev() {
            match (id, self.bytes_start, self.unk) {
                (Some(id), _, _) => ids.push(id),
                (None, Some(bytes), _) => ids.extend(piece.iter().map(|&b| bytes + u32::from(b))),
                // A run of unknown characters is one unknown id.
                (None, None, Some(unk)) => {
                    if ids.last() != Some(&unk) {
                        ids.push(unk);
                    }
                }
                (None, None, None) => {}
            }
        }
        ids
    }
}

/// Makes `node` end a path of `score` through a piece from `start`, if it is unset or scores lower.
fn relax(node: &mut Node, id: Option<u32>, score: f32, start: usize) {
    if node.start.is_none() || score > node.score {
        *node = Node { id, score, start: Some(start) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(piece: &str, score: f32, kind: PieceType) -> Piece {
        Piece { piece: piece.to_owned(), score, kind }
    }

    #[test]
    fn the_best_path_wins_and_unknowns_merge() {
        let pieces = [
            piece("<unk>", 0.0, PieceType::Unknown),
            piece("▁", -1.0, PieceType::Normal),
            piece("a", -2.0, PieceType::Normal),
            piece("b", -2.0, PieceType::Normal),
            piece("ab", -3.0, PieceType::Normal),
            piece("▁ab", -4.5, PieceType::Normal),
            piece("</s>", 0.0, PieceType::Control),
        ];
        let u = Unigram::new(&pieces).unwrap();
        // ▁ + ab (−4) beats ▁ab (−4.5) and ▁ + a + b (−5).
        assert_eq!(u.encode("▁ab".as_bytes()), [1, 4]);
        // Unknown characters in a row are one <unk>; control pieces are never matched.
        assert_eq!(u.encode("a€€b".as_bytes()), [2, 0, 3]);
        assert_eq!(u.encode("</s>".as_bytes()), [0]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        let mut pieces = vec![piece("<unk>", 0.0, PieceType::Unknown)];
        pieces.extend((0..=255).map(|b| piece(&format!("<0x{b:02X}>"), 0.0, PieceType::Byte)));
        pieces.push(piece("a", -1.0, PieceType::Normal));
        let u = Unigram::new(&pieces).unwrap();
        assert_eq!(u.encode("a€".as_bytes()), [257, 1 + 0xE2, 1 + 0x82, 1 + 0xAC]);
        pieces.swap(1, 2);
        assert!(Unigram::new(&pieces).is_err(), "byte pieces out of order");
    }

    #[test]
    fn malformed_vocabularies_are_errors() {
        let dup = [piece("<unk>", 0.0, PieceType::Unknown), piece("a", 0.0, PieceType::Normal)];
        assert!(Unigram::new(&[dup[0].clone(), dup[1].clone(), dup[1].clone()]).is_err());
        assert!(Unigram::new(&[piece("a", 0.0, PieceType::Normal)]).is_err(), "no <unk>");
        assert!(Unigram::new(&[dup[0].clone(), piece("", 0.0, PieceType::Normal)]).is_err());
    }
}
