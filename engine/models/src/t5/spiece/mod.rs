//! [`SentencePiece`]: a SentencePiece tokenizer rebuilt from its serialised model, the bytes ComfyUI finds in a
//! file's `spiece_model` tensor and hands to the `sentencepiece` package (umT5's unigram model,
//! models-wan-video.md §5.1; Gemma 2's BPE model), so Kiln tokenises with the file's own vocabulary and
//! normaliser settings as ComfyUI does.
//!
//! - `proto.rs` decodes (and, for `kiln model synth`, writes) the `ModelProto` bytes;
//! - `normalize.rs` is the normaliser (user-defined symbols kept, character map, whitespace rules);
//! - `matcher.rs` finds the user-defined symbols, for the normaliser and the BPE segmentation;
//! - `unigram.rs` is the unigram segmentation, `bpe.rs` the BPE one, both with byte fallback.
//!
//! Checked against the `sentencepiece` package on the umT5 vocabulary and on small models of every normaliser
//! setting (`scripts/reference/umt5.py`, `tests/it/umt5.rs`), and on small BPE models trained with Gemma's
//! settings, the default normaliser and unused pieces (`scripts/reference/spiece_bpe.py`,
//! `tests/it/spiece_bpe.rs`).

mod bpe;
mod matcher;
mod normalize;
mod proto;
mod table;
mod unigram;

use std::sync::OnceLock;

use bpe::Bpe;
use matcher::PrefixMatcher;
use normalize::Normalizer;
use proto::{BPE, ModelProto, NormalizerSpec, Piece, PieceType, UNIGRAM};
use unigram::Unigram;

use crate::error::{Error, Result};

/// A SentencePiece unigram or BPE tokenizer. Cheap to share behind an `Arc`; building one from umT5's or Gemma's
/// 256 000 pieces takes a few tens of milliseconds.
#[derive(Debug, Clone)]
pub struct SentencePiece {
    normalizer: Normalizer,
    segmenter: Segmenter,
    pieces: usize,
}

/// The segmentation a model's type selects.
#[derive(Debug, Clone)]
enum Segmenter {
    /// `ModelType.UNIGRAM` (umT5).
    Unigram(Unigram),
    /// `ModelType.BPE` (Gemma).
    Bpe(Bpe),
}

impl SentencePiece {
    /// The tokenizer `proto` (a serialised `ModelProto`) describes; [`Error::Tokenizer`] naming what is wrong
    /// with a malformed model, or a model type other than unigram and BPE (word, char), which no file Kiln
    /// reads has.
    pub fn from_proto(proto: &[u8]) -> Result<SentencePiece> {
        let model = ModelProto::decode(proto)?;
        let pieces = model.pieces.len();
        let user_defined = model.pieces.iter().filter(|p| p.kind == PieceType::UserDefined);
        let user_defined = PrefixMatcher::new(user_defined.map(|p| p.piece.as_str()));
        let segmenter = match model.model_type {
            UNIGRAM => Segmenter::Unigram(Unigram::new(&model.pieces)?),
            BPE => Segmenter::Bpe(Bpe::new(model.pieces, model.byte_fallback)?),
            other => {
                return Err(Error::Tokenizer(format!(
                    "the SentencePiece model is of type {other} (3 word, 4 char); Kiln reads unigram (1) \
                     and BPE (2) models"
                )));
            }
        };
        Ok(SentencePiece {
            normalizer: Normalizer::new(
                &model.normalizer,
                model.treat_whitespace_as_suffix,
                user_defined,
            )?,
            segmenter,
            pieces,
        })
    }

    /// The ids of `text` as ComfyUI's `SPieceTokenizer` gives them with the EOS it appends taken off (what its
    /// `SDTokenizer` keeps of `tokenizer(text)["input_ids"]`): the text normalised, then segmented. Control
    /// symbols written in the text (`</s>`, `<pad>`) are text like any other. Never fails for a model that loaded.
    pub fn word_ids(&self, text: &str) -> Result<Vec<u32>> {
        let normalized = self.normalizer.normalize(text);
        Ok(match &self.segmenter {
            Segmenter::Unigram(unigram) => unigram.encode(&normalized),
            Segmenter::Bpe(bpe) => bpe.encode(&normalized),
        })
    }

    /// The number of pieces (the highest id is one less).
    pub fn vocab_size(&self) -> usize {
        self.pieces
    }
}

/// The SentencePiece model `kiln model synth` writes into its umT5 files' `spiece_model` tensor (381 pieces, so
/// every id is below [`SYNTH_PIECES`]): umT5's special pieces at umT5's ids (`<pad>` 0, `</s>` 1, `<s>` 2,
/// `<unk>` 3), the 256 byte pieces (4–259) so any text tokenises, then `▁`, the printable ASCII characters and
/// `▁a`…`▁z`; identity normalisation, whitespace kept as umT5's vocabulary suggests.
pub fn synth_model() -> &'static [u8] {
    static MODEL: OnceLock<Vec<u8>> = OnceLock::new();
    MODEL.get_or_init(|| {
        let piece = |piece: String, score: f32, kind: PieceType| Piece { piece, score, kind };
        let mut pieces = vec![
            piece("<pad>".into(), 0.0, PieceType::Control),
            piece("</s>".into(), 0.0, PieceType::Control),
            piece("<s>".into(), 0.0, PieceType::Control),
            piece("<unk>".into(), 0.0, PieceType::Unknown),
        ];
        pieces.extend((0..=255u8).map(|b| piece(format!("<0x{b:02X}>"), 0.0, PieceType::Byte)));
        pieces.push(piece(normalize::SPACE_SYMBOL.into(), -2.0, PieceType::Normal));
        for (i, c) in ('!'..='~').enumerate() {
            pieces.push(piece(c.to_string(), -4.0 - 0.01 * i as f32, PieceType::Normal));
        }
        for (i, c) in ('a'..='z').enumerate() {
            let word = format!("{}{c}", normalize::SPACE_SYMBOL);
            pieces.push(piece(word, -3.0 - 0.01 * i as f32, PieceType::Normal));
        }
        let model = ModelProto {
            pieces,
            model_type: UNIGRAM,
            treat_whitespace_as_suffix: false,
            byte_fallback: true,
            normalizer: NormalizerSpec {
                name: "identity".into(),
                charsmap: Vec::new(),
                add_dummy_prefix: true,
                remove_extra_whitespaces: false,
                escape_whitespaces: true,
            },
        };
        model.encode([3, 2, 1, 0])
    })
}

/// The pieces of [`synth_model`].
pub const SYNTH_PIECES: usize = 4 + 256 + 1 + 94 + 26;

/// The SentencePiece BPE model `kiln model synth` writes into its Gemma 2 files' `spiece_model` tensor (385
/// pieces, so every id is below [`SYNTH_BPE_PIECES`]): Gemma's special pieces at Gemma's ids (`<pad>` 0, `<eos>`
/// 1, `<bos>` 2 as control pieces, `<unk>` 3 the unknown piece), the 256 byte pieces (4–259) so any text
/// tokenises, `▁` (260), the printable ASCII characters (261–354), the merges `▁a`…`▁z` (355–380), `▁th` and
/// `▁the` (381, 382), and the user-defined `<start_of_turn>` and `<end_of_turn>` (383, 384); Gemma's settings:
/// identity normalisation, no dummy prefix, whitespace kept and escaped, byte fallback.
pub fn synth_bpe_model() -> &'static [u8] {
    static MODEL: OnceLock<Vec<u8>> = OnceLock::new();
    MODEL.get_or_init(|| {
        let piece = |piece: String, score: f32, kind: PieceType| Piece { piece, score, kind };
        let space = normalize::SPACE_SYMBOL;
        let mut pieces = vec![
            piece("<pad>".into(), 0.0, PieceType::Control),
            piece("<eos>".into(), 0.0, PieceType::Control),
            piece("<bos>".into(), 0.0, PieceType::Control),
            piece("<unk>".into(), 0.0, PieceType::Unknown),
        ];
        pieces.extend((0..=255u8).map(|b| piece(format!("<0x{b:02X}>"), 0.0, PieceType::Byte)));
        // As the BPE trainer scores them: merges by rank from 0 down, characters below every merge.
        pieces.push(piece(space.into(), -100.0, PieceType::Normal));
        for (i, c) in ('!'..='~').enumerate() {
            pieces.push(piece(c.to_string(), -101.0 - i as f32, PieceType::Normal));
        }
        for (i, c) in ('a'..='z').enumerate() {
            pieces.push(piece(format!("{space}{c}"), -(i as f32), PieceType::Normal));
        }
        pieces.push(piece(format!("{space}th"), -26.0, PieceType::Normal));
        pieces.push(piece(format!("{space}the"), -27.0, PieceType::Normal));
        for symbol in ["<start_of_turn>", "<end_of_turn>"] {
            pieces.push(piece(symbol.into(), 0.0, PieceType::UserDefined));
        }
        let model = ModelProto {
            pieces,
            model_type: BPE,
            treat_whitespace_as_suffix: false,
            byte_fallback: true,
            normalizer: NormalizerSpec {
                name: "identity".into(),
                charsmap: Vec::new(),
                add_dummy_prefix: false,
                remove_extra_whitespaces: false,
                escape_whitespaces: true,
            },
        };
        model.encode([3, 2, 1, 0])
    })
}

/// The pieces of [`synth_bpe_model`].
pub const SYNTH_BPE_PIECES: usize = 4 + 256 + 1 + 94 + 26 + 2 + 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synthetic_model_loads_and_tokenises_anything() {
        let sp = SentencePiece::from_proto(synth_model()).unwrap();
        assert_eq!(sp.vocab_size(), SYNTH_PIECES);
        // "▁a" "b" / "▁" "▁" (spaces kept) / bytes of "色".
        assert_eq!(sp.word_ids("ab").unwrap(), [355, 261 + (b'b' - b'!') as u32]);
        assert_eq!(sp.word_ids(" ").unwrap(), [260, 260]);
        assert_eq!(sp.word_ids("色").unwrap(), [260, 4 + 0xE8, 4 + 0x89, 4 + 0xB2]);
        assert_eq!(sp.word_ids("").unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn the_synthetic_bpe_model_loads_and_tokenises_anything() {
        let sp = SentencePiece::from_proto(synth_bpe_model()).unwrap();
        assert_eq!(sp.vocab_size(), SYNTH_BPE_PIECES);
        let ascii = |c: u8| 261 + u32::from(c - b'!');
        // No dummy prefix: "a" "b".
        assert_eq!(sp.word_ids("ab").unwrap(), [ascii(b'a'), ascii(b'b')]);
        // "▁c" (score −2) merges before "▁t" (−19), which then grows into "▁th" and "▁the".
        assert_eq!(sp.word_ids(" the cat").unwrap(), [382, 357, ascii(b'a'), ascii(b't')]);
        // Spaces kept, never merged; user-defined symbols whole; bytes of "色".
        assert_eq!(sp.word_ids("  ").unwrap(), [260, 260]);
        assert_eq!(sp.word_ids("<start_of_turn>x<end_of_turn>").unwrap(), [383, ascii(b'x'), 384]);
        assert_eq!(sp.word_ids("色").unwrap(), [4 + 0xE8, 4 + 0x89, 4 + 0xB2]);
        assert_eq!(sp.word_ids("").unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn only_unigram_and_bpe_models_load() {
        let mut model = ModelProto::decode(synth_model()).unwrap();
        model.model_type = 3;
        let err = SentencePiece::from_proto(&model.encode([3, 2, 1, 0])).unwrap_err();
        assert!(err.to_string().contains("BPE (2)"), "{err}");
    }

    #[test]
    fn user_defined_symbols_escape_the_normaliser() {
        // The synthetic unigram model with two spaces user-defined and extra whitespace removed: the symbol is
        // kept whole, both its spaces included (as the `sentencepiece` package does).
        let mut model = ModelProto::decode(synth_model()).unwrap();
        model.pieces.push(Piece { piece: "  ".into(), score: 0.0, kind: PieceType::UserDefined });
        model.normalizer.remove_extra_whitespaces = true;
        let sp = SentencePiece::from_proto(&model.encode([3, 2, 1, 0])).unwrap();
        assert_eq!(sp.word_ids("a  b").unwrap(), [355, 260, 356]);
        assert_eq!(sp.word_ids("a   b").unwrap(), [355, 260, 356]);
        assert_eq!(sp.word_ids("a b").unwrap(), [355, 356]);
    }
}
