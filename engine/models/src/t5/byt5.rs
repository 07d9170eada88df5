//! ByT5's tokenizer as ComfyUI's HunyuanImage and HunyuanVideo 1.5 tokenizers use it (`ByT5SmallTokenizer`,
//! transformers' `ByT5Tokenizer`): every UTF-8 byte is one token (`byte + 3`), the special tokens `<pad>`, `</s>`,
//! `<unk>` and `<extra_id_0>` … `<extra_id_124>` written in the text are theirs; and which text it reads: the
//! prompt's quoted passages, each as `Text "…". ` ([`quoted_text`]).

use crate::error::Result;
use crate::prompt_weights::{self, Layout, Weighted};

/// Ids below the bytes' (`<pad>`, `</s>`, `<unk>`).
const BYTE_OFFSET: u32 = 3;
/// `<extra_id_0>`'s id: the first after the 256 bytes'.
const EXTRA_ID_BASE: u32 = BYTE_OFFSET + 256;
/// The `<extra_id_N>` tokens the tokenizer knows (transformers' default `extra_ids`).
const EXTRA_IDS: u32 = 125;
/// The special tokens other than `<extra_id_N>`, by id.
const SPECIALS: [(&str, u32); 3] = [("<pad>", 0), ("</s>", 1), ("<unk>", 2)];

/// ByT5's prompt layout in ComfyUI's `ByT5SmallTokenizer`: no start token, `</s>` closing one section that is
/// never padded nor truncated (`min_length` 1).
pub const BYT5_PROMPT_LAYOUT: Layout = Layout {
    start: None,
    end: Some(super::EOS),
    pad: super::PAD,
    max_length: 99_999_999,
    pad_to_max_length: false,
    min_length: Some(1),
    min_padding: None,
};

/// The ids of `text` without the `</s>` the tokenizer appends (what ComfyUI's `SDTokenizer` keeps of
/// `tokenizer(text)["input_ids"]`): special tokens written in the text are matched first, every other byte is
/// `byte + 3`.
pub fn byt5_word_ids(text: &str) -> Vec<u32> {
    let mut ids = Vec::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some((len, id)) = special_at(rest) {
            ids.push(id);
            rest = &rest[len..];
            continue;
        }
        // Up to the next `<` (where a special token may start), byte by byte.
        let first = rest.chars().next().map_or(1, char::len_utf8);
        let next = rest[first..].find('<').map_or(rest.len(), |i| i + first);
        ids.extend(rest[..next].bytes().map(|byte| u32::from(byte) + BYTE_OFFSET));
        rest = &rest[next..];
    }
    ids
}

/// The special token `text` starts with, as (its length in bytes, its id).
fn special_at(text: &str) -> Option<(usize, u32)> {
    if !text.starts_with('<') {
        return None;
    }
    if let Some(&(name, id)) = SPECIALS.iter().find(|(name, _)| text.starts_with(name)) {
        return Some((name.len(), id));
    }
    let digits = text.strip_prefix("<extra_id_")?;
    let end = digits.find('>')?;
    let number = &digits[..end];
    // transformers matches the added tokens' exact text: `<extra_id_03>` is not `<extra_id_3>`.
    if number.is_empty()
        || !number.bytes().all(|c| c.is_ascii_digit())
        || (number.len() > 1 && number.starts_with('0'))
    {
        return None;
    }
    let n: u32 = number.parse().ok()?;
    (n < EXTRA_IDS).then(|| ("<extra_id_".len() + end + 1, EXTRA_ID_BASE + n))
}

/// What ComfyUI's `HunyuanImageTokenizer` hands ByT5 for `prompt`: every passage in straight double quotes, then
/// every one in ‘ ’, then every one in “ ”, each as `Text "…". ` (Python's non-greedy `re.findall`, which stops
/// at a line break); `None` when the prompt quotes nothing (ComfyUI then makes no ByT5 tokens).
pub fn quoted_text(prompt: &str) -> Option<String> {
    let mut passages = Vec::new();
    for (open, close) in [('"', '"'), ('‘', '’'), ('“', '”')] {
        passages.extend(quoted(prompt, open, close));
    }
    if passages.is_empty() {
        return None;
    }
    Some(passages.iter().map(|p| format!("Text \"{p}\". ")).collect())
}

/// The passages between `open` and the next `close` on the same line, scanning on after each (`open(.*?)close`).
fn quoted(text: &str, open: char, close: char) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(open) {
        let after = &rest[start + open.len_utf8()..];
        match after.find([close, '\n']) {
            Some(end) if after[end..].starts_with(close) => {
                out.push(&after[..end]);
                rest = &after[end + close.len_utf8()..];
            }
            // A line break first: this opening matches nothing; the search goes on after it.
            _ => rest = after,
        }
    }
    out
}

/// ByT5's weighted tokens for `prompt` as ComfyUI's HunyuanVideo 1.5 tokenizer makes them: [`quoted_text`] with
/// its weights parsed (`(text:1.2)`), each weighted piece's bytes, then `</s>`, one section never padded
/// ([`BYT5_PROMPT_LAYOUT`]); `None` when nothing is quoted. `embedding:` is plain text here: ComfyUI's
/// `ByT5SmallTokenizer` is given no embeddings folder.
pub fn byt5_tokens(prompt: &str) -> Result<Option<Vec<Vec<Weighted>>>> {
    let Some(text) = quoted_text(prompt) else { return Ok(None) };
    let mut section: Vec<Weighted> = prompt_weights::segments(&text)
        .into_iter()
        .flat_map(|(piece, weight)| byt5_word_ids(&piece).into_iter().map(move |id| (id, weight)))
        .collect();
    section.extend(BYT5_PROMPT_LAYOUT.end.map(|end| (end, 1.0)));
    Ok(Some(vec![section]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_special_tokens() {
        assert_eq!(byt5_word_ids("Ab"), vec![68, 101]);
        assert_eq!(byt5_word_ids("é"), vec![0xc3 + 3, 0xa9 + 3]);
        assert_eq!(byt5_word_ids("a<extra_id_3>b</s>"), vec![100, 262, 101, 1]);
        assert_eq!(
            byt5_word_ids("<extra_id_125><x"),
            byt5_word_ids("<extra_id_125>").into_iter().chain([63, 123]).collect::<Vec<_>>()
        );
    }

    #[test]
    fn quoted_passages_in_comfyui_order() {
        assert_eq!(quoted_text("no quotes"), None);
        assert_eq!(
            quoted_text("“c” then \"a\" and ‘b’ and \"d\""),
            Some("Text \"a\". Text \"d\". Text \"b\". Text \"c\". ".to_owned())
        );
        // Python's `.` stops at a line break: the first quote's passage never closes, the next pair quotes a space.
        assert_eq!(quoted_text("\"open\nclosed\" \"x\""), Some("Text \" \". ".to_owned()));
    }
}
