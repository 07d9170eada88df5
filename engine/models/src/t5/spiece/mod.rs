//! [`SentencePiece`]: a SentencePiece unigram tokenizer rebuilt from its serialised model, the bytes ComfyUI
//! finds in a umT5 file's `spiece_model` tensor and hands to the `sentencepiece` package (models-wan-video.md
//! §5.1), so Kiln tokenises with the file's own vocabulary and normaliser settings as ComfyUI does.
//!
//! - `proto.rs` decodes (and, for `kiln model synth`, writes) the `ModelProto` bytes;
//! - `normalize.rs` is the normaliser (character map, whitespace rules);
//! - `unigram.rs` the segmentation with byte fallback.
//!
//! Checked against the `sentencepiece` package on the umT5 vocabulary and on small models of every normaliser
//! setting (`scripts/reference/umt5.py`, `tests/it/umt5.rs`).

mod normalize;
mod proto;
mod unigram;

use std::sync::OnceLock;

use normalize::Normalizer;
use proto::{ModelProto, NormalizerSpec, Piece, PieceType, UNIGRAM};
use unigram::Unigram;

use crate::error::{Error, Result};

/// A SentencePiece unigram tokenizer. Cheap to share behind an `Arc`; building one from umT5's 256 000 pieces
/// takes a few tens of milliseconds.
#[derive(Debug, Clone)]
pub struct SentencePiece {
    normalizer: Normalizer,
    unigram: Unigram,
    pieces: usize,
}

impl SentencePiece {
    /// The tokenizer `proto` (a serialised `ModelProto`) describes; [`Error::Tokenizer`] naming what is wrong
    /// with a malformed model, or a model type other than unigram (BPE, word, char), which umT5 never has.
    pub fn from_proto(proto: &[u8]) -> Result<SentencePiece> {
        let model = ModelProto::decode(proto)?;
        if model.model_type != UNIGRAM {
            return Err(Error::Tokenizer(format!(
                "the SentencePiece model is of type {} (2 BPE, 3 word, 4 char); Kiln reads unigram models (1)",
                model.model_type
            )));
        }
        Ok(SentencePiece {
            normalizer: Normalizer::new(&model.normalizer, model.treat_whitespace_as_suffix)?,
            unigram: Unigram::new(&model.pieces)?,
            pieces: model.pieces.len(),
        })
    }

    /// The ids of `text` as ComfyUI's `SPieceTokenizer` gives them with the EOS it appends taken off (what its
    /// `SDTokenizer` keeps of `tokenizer(text)["input_ids"]`): the text normalised, then segmented. Control
    /// symbols written in the text (`</s>`, `<pad>`) are text like any other. Never fails for a model that loaded.
    pub fn word_ids(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.unigram.encode(&self.normalizer.normalize(text)))
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
    fn only_unigram_models_load() {
        let mut model = ModelProto::decode(synth_model()).unwrap();
        model.model_type = 2;
        let err = SentencePiece::from_proto(&model.encode([3, 2, 1, 0])).unwrap_err();
        assert!(err.to_string().contains("unigram"), "{err}");
    }
}
