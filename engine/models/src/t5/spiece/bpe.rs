//! [`Bpe`]: SentencePiece's BPE segmentation of normalised text (Gemma's tokenizer), as the `sentencepiece`
//! package ComfyUI imports (0.2.3) computes it (`bpe_model.cc`, `Model::SampleEncode` without dropout, and the
//! processor's `EncodeOptimized`):
//!
//! 1. the text is split into symbols: the longest user-defined symbol at each position (never merged), else one
//!    UTF-8 character;
//! 2. every adjacent pair whose concatenation is a normal, user-defined or unused piece goes on an agenda; the
//!    pair whose piece scores highest is merged first (scores ordered as `f32::total_cmp` orders them, ties to
//!    the leftmost), and the merged symbol's new pairs join the agenda;
//! 3. a final symbol that is an unused piece is split back into the two symbols it was last seen merged from
//!    (recursively, at most 100 levels deep); one never merged (an unused single character) is unknown;
//! 4. each symbol becomes its id; an unknown one becomes its UTF-8 bytes' `<0xXX>` pieces with byte fallback,
//!    else the unknown piece, a run of unknown symbols one unknown id.
//!
//! The invariant: every id returned is a piece of the model; control and byte pieces are never merged into.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::matcher::PrefixMatcher;
use super::proto::{Piece, PieceType};
use super::table::PieceTable;
use crate::error::{Error, Result};

/// How deep SentencePiece resegments an unused piece before it emits it as it is (`kMaxBpeResegmentDepth`).
const MAX_RESEGMENT_DEPTH: usize = 100;
/// The longest piece SentencePiece loads, in bytes (`kMaxPieceSize`, exclusive).
const MAX_PIECE_BYTES: usize = 8000;

/// A model's pieces, ready to segment.
#[derive(Debug, Clone)]
pub(crate) struct Bpe {
    /// The pieces by id (a lone NUL piece made unused under byte fallback, as the processor does).
    pieces: Vec<Piece>,
    /// Their ids by text (all but a lone unused NUL).
    table: PieceTable,
    /// The user-defined symbols.
    matcher: PrefixMatcher,
    /// The unknown piece's id, if the model has one.
    unk: Option<u32>,
    /// The ids of `<0x00>`…`<0xFF>`, when the model falls back to bytes.
    bytes: Option<Box<[u32; 256]>>,
}

/// A symbol of the text being segmented: bytes `start..start + len` (empty once merged into its left
/// neighbour), its neighbours, and whether it is a user-defined symbol.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
    frozen: bool,
}

/// A candidate merge on the agenda: symbols `left` and `right`, which were adjacent and `size` bytes long
/// together when it was found, into a piece of `score`.
#[derive(Debug, Clone, Copy)]
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Pair {
    /// Higher scores first, then the leftmost (SentencePiece's `SymbolPairComparator`, which orders scores by
    /// their bits exactly as `total_cmp` does).
    fn cmp(&self, other: &Pair) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Pair) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Pair) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

impl Bpe {
    /// The segmenter of `pieces` (`byte_fallback` as the model's trainer settings say); [`Error::Tokenizer`] for
    /// what SentencePiece refuses to load: an empty, overlong or repeated piece, a NUL inside a piece, two
    /// unknown pieces, byte pieces without byte fallback or not all 256 with it, a malformed byte piece, or no
    /// unknown piece without byte fallback.
    pub(crate) fn new(mut pieces: Vec<Piece>, byte_fallback: bool) -> Result<Bpe> {
        let bad = |msg: String| Error::Tokenizer(format!("the SentencePiece model: {msg}"));
        if u32::try_from(pieces.len()).is_err() {
            return Err(bad("more than 2³² pieces".to_owned()));
        }
        let mut table = PieceTable::with_capacity(pieces.len());
        let mut unk = None;
        let mut bytes = [None; 256];
        for id in 0..pieces.len() as u32 {
            let p = &mut pieces[id as usize];
            if p.piece.len() >= MAX_PIECE_BYTES {
                return Err(bad(format!("piece {id} is {} bytes long", p.piece.len())));
            }
            if p.piece.is_empty() {
                return Err(bad(format!("piece {id} is empty")));
            }
            // The processor makes a lone NUL piece unused under byte fallback, and the model skips it.
            if p.piece == "\0" && byte_fallback {
                p.kind = PieceType::Unused;
            }
            if p.piece == "\0" && p.kind == PieceType::Unused {
                continue;
            }
            if p.piece.contains('\0') {
                return Err(bad(format!("piece {id} holds a NUL character")));
            }
            let p = &pieces[id as usize];
            if table.insert(&pieces, id).is_some() {
                return Err(bad(format!("piece {:?} is defined twice", p.piece)));
            }
            match p.kind {
                PieceType::UserDefined => {}
                PieceType::Unknown if unk.is_some() => {
                    return Err(bad("it has two unknown pieces".to_owned()));
                }
                PieceType::Unknown => unk = Some(id),
                PieceType::Byte if !byte_fallback => {
                    return Err(bad(format!("byte piece {} without byte fallback", p.piece)));
                }
                PieceType::Byte => {
                    let byte = byte_of(&p.piece)
                        .ok_or_else(|| bad(format!("byte piece {:?} is malformed", p.piece)))?;
                    bytes[usize::from(byte)] = Some(id);
                }
                PieceType::Normal | PieceType::Control | PieceType::Unused => {}
            }
        }
        if unk.is_none() && !byte_fallback {
            return Err(bad("it has no unknown piece and no byte fallback".to_owned()));
        }
        let bytes = if byte_fallback {
            let mut table = Box::new([0u32; 256]);
            for (byte, id) in bytes.iter().enumerate() {
                table[byte] = id.ok_or_else(|| {
                    bad(format!("byte fallback without the byte piece <0x{byte:02X}>"))
                })?;
            }
            Some(table)
        } else {
            None
        };
        let user_defined = pieces.iter().filter(|p| p.kind == PieceType::UserDefined);
        let matcher = PrefixMatcher::new(user_defined.map(|p| p.piece.as_str()));
        Ok(Bpe { pieces, table, matcher, unk, bytes })
    }

    /// The ids of normalised text.
    pub(crate) fn encode(&self, text: &[u8]) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() / 2);
        let mut prev_unknown = false;
        for (piece, id) in self.segment(text) {
            let unknown = id.is_none_or(|id| self.kind(id) == PieceType::Unknown);
            match (&self.bytes, id) {
                (Some(bytes), _) if unknown => {
                    ids.extend(piece.iter().map(|&b| bytes[usize::from(b)]));
                }
                // A run of unknown symbols is one unknown id.
                _ if unknown && prev_unknown => {}
                (_, Some(id)) => ids.push(id),
                // No unknown piece, which only a model with byte fallback may lack.
                (_, None) => {}
            }
            prev_unknown = unknown;
        }
        ids
    }

    /// The final symbols of `text` and their ids (`None`: unknown, and the model has no unknown piece).
    fn segment<'t>(&self, text: &'t [u8]) -> Vec<(&'t [u8], Option<u32>)> {
        let mut merges = Merges::new(self, text);
        merges.run(self);
        let mut out = Vec::with_capacity(merges.symbols.len());
        let mut index = if merges.symbols.is_empty() { None } else { Some(0) };
        while let Some(i) = index {
            let s = merges.symbols[i];
            self.resegment(&text[s.start..s.start + s.len], &merges.unmerge, &mut out);
            index = s.next;
        }
        out
    }

    /// Appends `symbol` to `out` with its id, split back into the symbols it was merged from while it is an
    /// unused piece (`unmerge`: the last pair each unused piece was found from).
    fn resegment<'t>(
        &self,
        symbol: &'t [u8],
        unmerge: &HashMap<&'t [u8], (&'t [u8], &'t [u8])>,
        out: &mut Vec<(&'t [u8], Option<u32>)>,
    ) {
        let mut stack = vec![(symbol, 0usize)];
        while let Some((w, depth)) = stack.pop() {
            let found = self.id(w);
            if depth > MAX_RESEGMENT_DEPTH {
                out.push((w, found.or(self.unk)));
                continue;
            }
            let Some(id) = found.filter(|&id| self.mergeable(id)) else {
                out.push((w, self.unk));
                continue;
            };
            if self.kind(id) != PieceType::Unused {
                out.push((w, Some(id)));
            } else if let Some(&(left, right)) = unmerge.get(w) {
                stack.push((right, depth + 1));
                stack.push((left, depth + 1));
            } else {
                out.push((w, self.unk));
            }
        }
    }

    /// The id of the piece `text`.
    fn id(&self, text: &[u8]) -> Option<u32> {
        self.table.get(&self.pieces, text)
    }

    /// The type of piece `id`.
    fn kind(&self, id: u32) -> PieceType {
        self.pieces[id as usize].kind
    }

    /// Whether symbols may merge into piece `id` (a normal, user-defined or unused piece).
    fn mergeable(&self, id: u32) -> bool {
        matches!(self.kind(id), PieceType::Normal | PieceType::UserDefined | PieceType::Unused)
    }
}

/// The merging of one text's symbols.
struct Merges<'t> {
    text: &'t [u8],
    symbols: Vec<Symbol>,
    agenda: BinaryHeap<Pair>,
    /// For each unused piece a pair was found for, the last such pair's two symbols.
    unmerge: HashMap<&'t [u8], (&'t [u8], &'t [u8])>,
}

impl<'t> Merges<'t> {
    /// `text` split into its initial symbols, every adjacent pair that forms a piece on the agenda.
    fn new(bpe: &Bpe, text: &'t [u8]) -> Merges<'t> {
        let mut symbols = Vec::with_capacity(text.len());
        let mut start = 0;
        while start < text.len() {
            let (len, frozen) = bpe.matcher.prefix(&text[start..]);
            let index = symbols.len();
            symbols.push(Symbol {
                start,
                len,
                prev: index.checked_sub(1),
                next: (start + len < text.len()).then_some(index + 1),
                frozen,
            });
            start += len;
        }
        let mut merges = Merges {
            text,
            agenda: BinaryHeap::with_capacity(symbols.len()),
            symbols,
            unmerge: HashMap::new(),
        };
        for right in 1..merges.symbols.len() {
            merges.add(bpe, Some(right - 1), Some(right));
        }
        merges
    }

    /// Puts the pair `left`, `right` on the agenda if both exist, neither is user-defined, and together they
    /// are a piece symbols may merge into.
    fn add(&mut self, bpe: &Bpe, left: Option<usize>, right: Option<usize>) {
        let (Some(left), Some(right)) = (left, right) else { return };
        let (l, r) = (self.symbols[left], self.symbols[right]);
        if l.frozen || r.frozen {
            return;
        }
        let size = l.len + r.len;
        let piece = &self.text[l.start..l.start + size];
        let Some(id) = bpe.id(piece).filter(|&id| bpe.mergeable(id)) else { return };
        self.agenda.push(Pair { score: bpe.pieces[id as usize].score, left, right, size });
        if bpe.kind(id) == PieceType::Unused {
            let text = self.text;
            self.unmerge
                .insert(piece, (&text[l.start..l.start + l.len], &text[r.start..r.start + r.len]));
        }
    }

    /// Merges the best pair until none is left (stale pairs, whose symbols have changed since, skipped).
    fn run(&mut self, bpe: &Bpe) {
        while let Some(top) = self.agenda.pop() {
            let (l, r) = (self.symbols[top.left], self.symbols[top.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != top.size {
                continue;
            }
            self.symbols[top.left].len += r.len;
            self.symbols[top.left].next = r.next;
            if let Some(next) = r.next {
                self.symbols[next].prev = Some(top.left);
            }
            self.symbols[top.right].len = 0;
            self.add(bpe, l.prev, Some(top.left));
            self.add(bpe, Some(top.left), r.next);
        }
    }
}

/// The byte a byte piece (`<0xXX>`, upper-case hex) stands for.
fn byte_of(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    let upper = hex.len() == 2 && hex.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase());
    upper.then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(piece: &str, score: f32, kind: PieceType) -> Piece {
        Piece { piece: piece.to_owned(), score, kind }
    }

    /// `<unk>` 0, then `rest`, with byte pieces 1–256 when `bytes`.
    fn model(bytes: bool, rest: &[(&str, f32, PieceType)]) -> Bpe {
        let mut pieces = vec![piece("<unk>", 0.0, PieceType::Unknown)];
        if bytes {
            pieces.extend((0..=255).map(|b| piece(&format!("<0x{b:02X}>"), 0.0, PieceType::Byte)));
        }
        pieces.extend(rest.iter().map(|&(p, s, k)| piece(p, s, k)));
        Bpe::new(pieces, bytes).unwrap()
    }

    use PieceType::{Control, Normal, Unused, UserDefined};

    #[test]
    fn the_best_pair_merges_first_ties_to_the_left() {
        let bpe = model(
            false,
            &[
                ("a", -10.0, Normal),
                ("b", -10.0, Normal),
                ("c", -10.0, Normal),
                ("ab", -2.0, Normal),
                ("bc", -1.0, Normal),
                ("aa", -5.0, Normal),
            ],
        );
        // "bc" beats "ab"; "a" + "bc" is no piece.
        assert_eq!(bpe.encode(b"abc"), [1, 5]);
        // Equal scores: the leftmost pair.
        assert_eq!(bpe.encode(b"aaa"), [6, 1]);
        assert_eq!(bpe.encode(b"abab"), [4, 4]);
        assert_eq!(bpe.encode(b""), Vec::<u32>::new());
    }

    #[test]
    fn user_defined_symbols_are_never_merged_and_control_pieces_never_formed() {
        let bpe = model(
            false,
            &[
                ("a", -10.0, Normal),
                ("<t>", 0.0, UserDefined),
                ("a<", -1.0, Normal),
                ("<", -10.0, Normal),
                ("aa", 0.0, Control),
            ],
        );
        assert_eq!(bpe.encode(b"a<t>a"), [1, 2, 1]);
        assert_eq!(bpe.encode(b"a<a"), [3, 1]);
        assert_eq!(bpe.encode(b"aa"), [1, 1]);
    }

    #[test]
    fn unused_pieces_are_split_back_and_unknowns_merge() {
        let bpe = model(
            false,
            &[
                ("a", -10.0, Normal),
                ("b", -10.0, Normal),
                ("c", -10.0, Unused),
                ("ab", -1.0, Unused),
                ("abb", -2.0, Normal),
                ("ba", -3.0, Normal),
            ],
        );
        // "ab" (unused) merges, then nothing more: split back into "a" "b".
        assert_eq!(bpe.encode(b"ab"), [1, 2]);
        // Merging through an unused piece reaches "abb".
        assert_eq!(bpe.encode(b"abb"), [5]);
        // An unused single character is unknown; runs of unknowns are one id.
        assert_eq!(bpe.encode("ac€€b".as_bytes()), [1, 0, 2]);
    }

    #[test]
    fn unknown_symbols_fall_back_to_bytes() {
        let bpe = model(true, &[("a", -1.0, Normal)]);
        assert_eq!(bpe.encode("a€".as_bytes()), [257, 1 + 0xE2, 1 + 0x82, 1 + 0xAC]);
    }

    #[test]
    fn models_sentencepiece_refuses_are_errors() {
        let unk = piece("<unk>", 0.0, PieceType::Unknown);
        let a = piece("a", 0.0, Normal);
        assert!(Bpe::new(vec![unk.clone(), a.clone(), a.clone()], false).is_err(), "twice");
        assert!(Bpe::new(vec![a.clone()], false).is_err(), "no <unk>, no byte fallback");
        assert!(Bpe::new(vec![unk.clone(), unk.clone()], false).is_err());
        assert!(Bpe::new(vec![unk.clone(), piece("", 0.0, Normal)], false).is_err());
        assert!(Bpe::new(vec![unk.clone(), piece("a\0", 0.0, Normal)], false).is_err());
        let byte = piece("<0x41>", 0.0, PieceType::Byte);
        assert!(
            Bpe::new(vec![unk.clone(), byte.clone()], false).is_err(),
            "bytes without fallback"
        );
        assert!(Bpe::new(vec![unk.clone(), byte], true).is_err(), "one byte of 256");
        let mut pieces = vec![piece("\0", 0.0, Normal)];
        pieces.extend((0..=255).map(|b| piece(&format!("<0x{b:02X}>"), 0.0, PieceType::Byte)));
        let bpe = Bpe::new(pieces, true).unwrap();
        assert_eq!(bpe.encode(b"\0"), [1], "a NUL piece is unused under byte fallback");
        assert_eq!(byte_of("<0x0a>"), None);
        assert_eq!(byte_of("<0xFF>"), Some(255));
    }
}
