//! SentencePiece's `ModelProto` (its `sentencepiece_model.proto`) decoded from, and written to, protobuf bytes:
//! the fields the unigram and BPE encoders read, every other field skipped as protobuf skips unknown fields.
//!
//! Proto2 defaults hold for absent fields (a piece is `NORMAL` with score 0; the normaliser adds a dummy prefix,
//! removes extra whitespace and escapes spaces as `▁`; the model is a unigram model). A field given twice keeps
//! its last value, as protobuf merges a message.

use crate::error::{Error, Result};

/// How a piece takes part in encoding (`ModelProto.SentencePiece.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PieceType {
    /// A piece of text the segmentation may pick (1).
    Normal,
    /// The unknown piece (2).
    Unknown,
    /// A control symbol such as `</s>`, never produced from text (3).
    Control,
    /// A user-defined symbol, picked from text with a bonus (4).
    UserDefined,
    /// A piece kept in the vocabulary but never picked (5).
    Unused,
    /// One byte of byte fallback, `<0xXX>` (6).
    Byte,
}

impl PieceType {
    /// The type of wire value `v`.
    fn from_wire(v: u64) -> Result<PieceType> {
        Ok(match v {
            1 => PieceType::Normal,
            2 => PieceType::Unknown,
            3 => PieceType::Control,
            4 => PieceType::UserDefined,
            5 => PieceType::Unused,
            6 => PieceType::Byte,
            other => return Err(bad(format!("a piece of unknown type {other}"))),
        })
    }

    /// The wire value.
    fn to_wire(self) -> u64 {
        match self {
            PieceType::Normal => 1,
            PieceType::Unknown => 2,
            PieceType::Control => 3,
            PieceType::UserDefined => 4,
            PieceType::Unused => 5,
            PieceType::Byte => 6,
        }
    }
}

/// One vocabulary entry; its id is its index.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Piece {
    /// The text it stands for (spaces as `▁`).
    pub(crate) piece: String,
    /// Its log-probability (unigram), or its merge priority, higher first (BPE).
    pub(crate) score: f32,
    /// How it takes part in encoding.
    pub(crate) kind: PieceType,
}

/// The normaliser's settings (`NormalizerSpec`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NormalizerSpec {
    /// The rule's name (`nmt_nfkc`, `identity`, …), for messages only: the map below is the rule.
    pub(crate) name: String,
    /// The compiled character map (a Darts trie and its replacement strings); empty for `identity`.
    pub(crate) charsmap: Vec<u8>,
    /// Whether a `▁` goes before the text.
    pub(crate) add_dummy_prefix: bool,
    /// Whether leading, trailing and repeated spaces are dropped.
    pub(crate) remove_extra_whitespaces: bool,
    /// Whether spaces become `▁`.
    pub(crate) escape_whitespaces: bool,
}

impl Default for NormalizerSpec {
    fn default() -> NormalizerSpec {
        NormalizerSpec {
            name: String::new(),
            charsmap: Vec::new(),
            add_dummy_prefix: true,
            remove_extra_whitespaces: true,
            escape_whitespaces: true,
        }
    }
}

/// The model: its pieces, the trainer settings encoding depends on, and the normaliser.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelProto {
    /// The vocabulary, by id.
    pub(crate) pieces: Vec<Piece>,
    /// `TrainerSpec.model_type`: 1 unigram, 2 BPE, 3 word, 4 char.
    pub(crate) model_type: u64,
    /// `TrainerSpec.treat_whitespace_as_suffix`: the dummy `▁` goes after the text.
    pub(crate) treat_whitespace_as_suffix: bool,
    /// `TrainerSpec.byte_fallback`, as written (encoding looks for the byte pieces themselves).
    pub(crate) byte_fallback: bool,
    /// The normaliser.
    pub(crate) normalizer: NormalizerSpec,
}

/// `ModelType.UNIGRAM`.
pub(crate) const UNIGRAM: u64 = 1;
/// `ModelType.BPE`.
pub(crate) const BPE: u64 = 2;

impl ModelProto {
    /// The model in `bytes` (a serialised `ModelProto`); [`Error::Tokenizer`] saying what is malformed.
    pub(crate) fn decode(bytes: &[u8]) -> Result<ModelProto> {
        let mut model = ModelProto {
            pieces: Vec::new(),
            model_type: UNIGRAM,
            treat_whitespace_as_suffix: false,
            byte_fallback: false,
            normalizer: NormalizerSpec::default(),
        };
        let mut r = Reader { bytes, at: 0 };
        while let Some((field, value)) = r.field()? {
            match (field, value) {
                (1, Value::Bytes(b)) => model.pieces.push(decode_piece(b)?),
                (2, Value::Bytes(b)) => decode_trainer(b, &mut model)?,
                (3, Value::Bytes(b)) => decode_normalizer(b, &mut model.normalizer)?,
                (1..=3, _) => {
                    return Err(bad(format!("field {field} of ModelProto is not a message")));
                }
                _ => {}
            }
        }
        Ok(model)
    }

    /// The serialised model: the pieces, the trainer settings above with ids `unk`, `bos`, `eos` and `pad`
    /// (−1: none) and, where they differ from the defaults (`<unk>`, `<s>`, `</s>`, `<pad>`), the names of the
    /// pieces at those ids (the `sentencepiece` package finds its special ids by name), and the normaliser (what
    /// `kiln model synth` writes into a file's `spiece_model`).
    pub(crate) fn encode(&self, [unk, bos, eos, pad]: [i32; 4]) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in &self.pieces {
            let mut p = Vec::new();
            put_bytes(&mut p, 1, piece.piece.as_bytes());
            put_tag(&mut p, 2, 5);
            p.extend_from_slice(&piece.score.to_le_bytes());
            put_varint_field(&mut p, 3, piece.kind.to_wire());
            put_bytes(&mut out, 1, &p);
        }
        let mut t = Vec::new();
        put_varint_field(&mut t, 3, self.model_type);
        put_varint_field(&mut t, 4, self.pieces.len() as u64);
        put_varint_field(&mut t, 24, u64::from(self.treat_whitespace_as_suffix));
        put_varint_field(&mut t, 35, u64::from(self.byte_fallback));
        for (field, id) in [(40, unk), (41, bos), (42, eos), (43, pad)] {
            // Protobuf writes a negative int32 as its 64-bit two's complement.
            put_varint_field(&mut t, field, i64::from(id) as u64);
        }
        let specials =
            [(45, unk, "<unk>"), (46, bos, "<s>"), (47, eos, "</s>"), (48, pad, "<pad>")];
        for (field, id, default) in specials {
            let piece = usize::try_from(id).ok().and_then(|id| self.pieces.get(id));
            if let Some(piece) = piece.filter(|p| p.piece != default) {
                put_bytes(&mut t, field, piece.piece.as_bytes());
            }
        }
        put_bytes(&mut out, 2, &t);
        let n = &self.normalizer;
        let mut s = Vec::new();
        put_bytes(&mut s, 1, n.name.as_bytes());
        put_bytes(&mut s, 2, &n.charsmap);
        put_varint_field(&mut s, 3, u64::from(n.add_dummy_prefix));
        put_varint_field(&mut s, 4, u64::from(n.remove_extra_whitespaces));
        put_varint_field(&mut s, 5, u64::from(n.escape_whitespaces));
        put_bytes(&mut out, 3, &s);
        out
    }
}

/// A `SentencePiece` message.
fn decode_piece(bytes: &[u8]) -> Result<Piece> {
    let mut piece = Piece { piece: String::new(), score: 0.0, kind: PieceType::Normal };
    let mut r = Reader { bytes, at: 0 };
    while let Some((field, value)) = r.field()? {
        match (field, value) {
            (1, Value::Bytes(b)) => {
                piece.piece = String::from_utf8(b.to_vec())
                    .map_err(|_| bad("a piece that is not UTF-8".to_owned()))?;
            }
            (2, Value::Fixed32(bits)) => piece.score = f32::from_bits(bits),
            (3, Value::Varint(v)) => piece.kind = PieceType::from_wire(v)?,
            (1..=3, _) => {
                return Err(bad(format!("field {field} of a piece has the wrong wire type")));
            }
            _ => {}
        }
    }
    Ok(piece)
}

/// The fields of a `TrainerSpec` that encoding depends on.
fn decode_trainer(bytes: &[u8], model: &mut ModelProto) -> Result<()> {
    let mut r = Reader { bytes, at: 0 };
    while let Some((field, value)) = r.field()? {
        match (field, value) {
            (3, Value::Varint(v)) => model.model_type = v,
            (24, Value::Varint(v)) => model.treat_whitespace_as_suffix = v != 0,
            (35, Value::Varint(v)) => model.byte_fallback = v != 0,
            (3 | 24 | 35, _) => {
                return Err(bad(format!("field {field} of TrainerSpec has the wrong wire type")));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A `NormalizerSpec`.
fn decode_normalizer(bytes: &[u8], spec: &mut NormalizerSpec) -> Result<()> {
    let mut r = Reader { bytes, at: 0 };
    while let Some((field, value)) = r.field()? {
        match (field, value) {
            (1, Value::Bytes(b)) => spec.name = String::from_utf8_lossy(b).into_owned(),
            (2, Value::Bytes(b)) => spec.charsmap = b.to_vec(),
            (3, Value::Varint(v)) => spec.add_dummy_prefix = v != 0,
            (4, Value::Varint(v)) => spec.remove_extra_whitespaces = v != 0,
            (5, Value::Varint(v)) => spec.escape_whitespaces = v != 0,
            (1..=5, _) => {
                return Err(bad(format!(
                    "field {field} of NormalizerSpec has the wrong wire type"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// One field's value by wire type.
enum Value<'a> {
    Varint(u64),
    Fixed32(u32),
    Bytes(&'a [u8]),
    /// A fixed64 (nothing read here has one).
    Fixed64,
}

/// A cursor over a message's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// The next field's number and value, `None` at the end of the message.
    fn field(&mut self) -> Result<Option<(u64, Value<'a>)>> {
        if self.at == self.bytes.len() {
            return Ok(None);
        }
        let tag = self.varint()?;
        let field = tag >> 3;
        let value = match tag & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Fixed64
            }
            2 => {
                let len = usize::try_from(self.varint()?)
                    .map_err(|_| bad("a length beyond memory".to_owned()))?;
                Value::Bytes(self.take(len)?)
            }
            5 => {
                let b = self.take(4)?;
                Value::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            wire => {
                return Err(bad(format!(
                    "field {field} has wire type {wire}, which it cannot have"
                )));
            }
        };
        Ok(Some((field, value)))
    }

    /// A base-128 varint.
    fn varint(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte =
                *self.bytes.get(self.at).ok_or_else(|| bad("it ends inside a number".into()))?;
            self.at += 1;
            value |= u64::from(byte & 0x7F) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(bad("a number longer than ten bytes".to_owned()))
    }

    /// The next `len` bytes.
    fn take(&mut self, len: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(len).filter(|&end| end <= self.bytes.len());
        let end = end.ok_or_else(|| bad("a field runs past its end".to_owned()))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7F) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_tag(out: &mut Vec<u8>, field: u64, wire: u64) {
    put_varint(out, field << 3 | wire);
}

fn put_varint_field(out: &mut Vec<u8>, field: u64, v: u64) {
    put_tag(out, field, 0);
    put_varint(out, v);
}

fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_tag(out, field, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A malformed-model error.
fn bad(msg: String) -> Error {
    Error::Tokenizer(format!("the SentencePiece model is malformed: {msg}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_round_trips() {
        let model = ModelProto {
            pieces: vec![
                Piece { piece: "<unk>".into(), score: 0.0, kind: PieceType::Unknown },
                Piece { piece: "▁a".into(), score: -1.5, kind: PieceType::Normal },
                Piece { piece: "<0x00>".into(), score: 0.0, kind: PieceType::Byte },
            ],
            model_type: UNIGRAM,
            treat_whitespace_as_suffix: true,
            byte_fallback: true,
            normalizer: NormalizerSpec {
                name: "identity".into(),
                charsmap: vec![1, 2, 3],
                add_dummy_prefix: false,
                remove_extra_whitespaces: false,
                escape_whitespaces: true,
            },
        };
        assert_eq!(ModelProto::decode(&model.encode([0, -1, -1, -1])).unwrap(), model);
    }

    #[test]
    fn absent_fields_take_proto2_defaults_and_unknown_ones_are_skipped() {
        // A piece with its text only, and an unknown fixed64 field 9 and varint field 10.
        let mut bytes = Vec::new();
        let mut piece = Vec::new();
        put_bytes(&mut piece, 1, b"x");
        put_bytes(&mut bytes, 1, &piece);
        put_tag(&mut bytes, 9, 1);
        bytes.extend_from_slice(&[0; 8]);
        put_varint_field(&mut bytes, 10, 300);
        let model = ModelProto::decode(&bytes).unwrap();
        assert_eq!(
            model.pieces,
            [Piece { piece: "x".into(), score: 0.0, kind: PieceType::Normal }]
        );
        assert_eq!(model.model_type, UNIGRAM);
        assert_eq!(model.normalizer, NormalizerSpec::default());
    }

    #[test]
    fn truncated_bytes_are_an_error() {
        let model = ModelProto::decode(&[0x0A, 0x05, b'a']);
        assert!(matches!(model, Err(Error::Tokenizer(m)) if m.contains("past its end")));
        assert!(ModelProto::decode(&[0x08, 0x80]).is_err());
        assert!(ModelProto::decode(&[0x0B]).is_err(), "wire type 3 (a group)");
    }
}
