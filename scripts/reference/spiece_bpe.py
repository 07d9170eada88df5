"""Fixtures for Kiln's SentencePiece BPE segmentation (engine/models/tests/fixtures/spiece_bpe/), the model type of
Gemma's `tokenizer.model`.

Run from the repository root, with the reference venv (sentencepiece 0.2.3 and protobuf 7.36.2, pinned in
requirements.txt):
  $(scripts/reference/setup.sh) scripts/reference/spiece_bpe.py
or any venv with exactly those two packages:
  python3 -m venv /tmp/spvenv && /tmp/spvenv/bin/pip install sentencepiece==0.2.3 protobuf==7.36.2
  /tmp/spvenv/bin/python scripts/reference/spiece_bpe.py

The reference is the `sentencepiece` package itself, which ComfyUI hands the `spiece_model` bytes of a Gemma 2 file
to. Tiny BPE models are trained here on the small built-in CORPUS (English, digits, punctuation, CJK, emoji), so
nothing is downloaded:

- gemma_like.model.gz: Gemma's settings: `<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3, the identity normaliser, no
  dummy prefix, whitespace kept, digits split, byte fallback, whitespace-only pieces, and user-defined symbols
  (`<start_of_turn>`, `<end_of_turn>`, runs of `\\n` and of `▁`).
- nmt_nfkc.model.gz: the trainer's defaults (the `nmt_nfkc` character map, a dummy prefix, extra whitespace
  removed), no byte fallback and a character coverage below 1, so unknown characters become `<unk>` (runs of
  them one id); two user-defined symbols the map would change (`①`, `ﬁ`), which the normaliser keeps as written.
- unused.model.gz: gemma_like with some merged pieces, merges of merges (`▁th` under `▁the`, `in` under `ing`)
  and one single character (`z`) flipped to UNUSED in the proto (`sentencepiece_model_pb2`), so the encoder's
  resegmentation of unused pieces into the pieces they were merged from runs; the script checks the flipped
  pieces did appear before. (An unused character is unknown, so byte fallback, in 0.2.3; 0.2.0 gave its id.)
- cases.json: for each model, `SentencePieceProcessor(model_proto=...).encode(text)` (no BOS, no EOS) for every
  text of TEXTS (empty, sentences, runs of spaces, tabs, newlines and blank lines, digits, punctuation, CJK, emoji,
  combining marks, the user-defined symbols, a long prompt, characters the corpus lacks).

Independent references only (sentencepiece); no Kiln code.
"""

import gzip
import io
import json
import pathlib

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "engine/models/tests/fixtures/spiece_bpe"
VERSION = "0.2.3"
Type = pb.ModelProto.SentencePiece

CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox runs into the forest.
A photograph of a red car parked on a quiet street at night, with neon lights reflecting in the puddles.
In the morning the city wakes up: buses, bicycles, coffee shops and the smell of fresh bread.
She said: "Is this the right way to the station?" He answered, 'Yes -- turn left, then right; it's 200 m away.'
Prices rose by 3.5% in 2023, from $1,299.99 to $1,345.50; the index closed at 10,482 points on 12/31/2023.
Call 555-0142 or write to info@example.com before 09:30. Order #4471 shipped on 2024-06-01.
Lists: (a) apples, (b) oranges, (c) pears [fresh]; {key: value}; x = y + 2 * z / 4 - 1; a < b > c & d | e ^ f ~ g.
The theory of everything is the thing that the thinkers think about when they are thinking.
Running, jumping, swimming and singing are the things we like doing in the evening.
Indented lines keep their spaces:
    four spaces before this line
        eight spaces before this one
\ttabs\tbetween\twords\tand a tab at the start

Blank lines separate paragraphs.


Two blank lines above this sentence.
東京は日本の首都です。今日は天気がいいですね。私は猫が好きです。
北京是中国的首都。今天天气很好。我喜欢猫和狗。
서울은 한국의 수도입니다. 고양이를 좋아해요.
Emoji: 😀 😂 🚀 🎉 ❤️ 👍 🐱 🐶 🌍 ✨ — they show up in chat messages all the time 😀😀 🚀🚀.
Café, naïve, résumé, façade, jalapeño, Zürich, São Paulo, Ångström, smørrebrød.
Greek: αβγδε, Russian: привет мир, Arabic: مرحبا بالعالم, Hebrew: שלום עולם.
<start_of_turn>user
Write a poem about the sea.<end_of_turn>
<start_of_turn>model
The sea is wide, the sea is deep, the waves roll in and never sleep.<end_of_turn>
<start_of_turn>user
Describe a cat in three words.<end_of_turn>
<start_of_turn>model
Soft, curious, independent.<end_of_turn>
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 123456789 3.14159 2.71828 1e-5 0x1F.
Code: fn main() { println!("hello, world"); } // comment
def f(x): return x ** 2  # python
if (a && b) || !c { return -1; } else { return 0; }
The end of the corpus, with the last words: alpha beta gamma delta epsilon zeta eta theta.
"""

LONG_PROMPT = (
    "A cinematic wide shot of an old lighthouse on a rocky cliff at dusk, waves crashing below, seagulls "
    "circling in the orange sky, volumetric light, 35mm film grain, highly detailed, 8k. The keeper, a woman "
    "in her 60s wearing a yellow raincoat, stands at the railing holding a lantern; behind her the lamp turns "
    "slowly. Mood: calm but lonely. Colours: teal & orange (2:1), contrast +15%, exposure -0.3EV. "
    "东京的夜晚 🌃 and the sea of stars ✨✨✨ — no text, no watermark, no blur!!!"
)

TEXTS = [
    "",
    " ",
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "the theory of the thing",
    "  leading and trailing spaces  ",
    "multiple     spaces   between  words",
    "\ttab at the start\tand\tinside",
    "line one\nline two\n\nafter a blank line\n\n\nthree newlines\n",
    "Prices: $1,299.99 on 2024-06-01 at 09:30, 123456789 and 3.14159",
    "Punctuation!?;:…—–-·•/\\|@#$%^&*_+=~`<>[]{}()\"'",
    "東京は日本の首都です。北京是中国的首都。",
    "Emoji 😀😂🚀 ❤️ 👍🏽 🏳️‍🌈 in text",
    "Café naïve e\u0301 a\u0308 ① ﬁ ½ x² ＡＢＣ",
    "<start_of_turn>user\nHello there!<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn><end_of_turn><start_of_turn>",
    "ẞ Ω 🦀 ꙮ 𝔘𝔫𝔦 are not in the corpus",
    "▁literal▁lower▁blocks▁▁and _ underscores",
    "ⅫⅫⅫ ㊿㊿ zzzz qqqq xxxx",
    "① ﬁ ①① ﬁﬁ",
    "theeee thththe the the the",
    LONG_PROMPT,
]

GEMMA_LIKE = dict(
    model_type="bpe",
    vocab_size=700,
    pad_id=0,
    eos_id=1,
    bos_id=2,
    unk_id=3,
    pad_piece="<pad>",
    eos_piece="<eos>",
    bos_piece="<bos>",
    unk_piece="<unk>",
    normalization_rule_name="identity",
    add_dummy_prefix=False,
    remove_extra_whitespaces=False,
    split_digits=True,
    byte_fallback=True,
    allow_whitespace_only_pieces=True,
    user_defined_symbols=["<start_of_turn>", "<end_of_turn>", "\n", "\n\n", "\n\n\n", "▁▁", "▁▁▁", "▁▁▁▁"],
    character_coverage=1.0,
)
NMT_NFKC = dict(
    model_type="bpe",
    vocab_size=400,
    byte_fallback=False,
    character_coverage=0.98,
    user_defined_symbols=["①", "ﬁ"],
)
# Pieces of gemma_like flipped to UNUSED: merges (`▁th` also inside `▁the`, `in` inside `ing`) and one single
# character.
UNUSED = ["▁th", "▁the", "in", "ing", "he", "▁spaces", "z"]


def train(**options) -> bytes:
    """A model trained on CORPUS (one sentence a line) with `options`."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()),
        model_writer=out,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
        **options,
    )
    return out.getvalue()


def flip_unused(proto: bytes, pieces) -> bytes:
    """`proto` with `pieces` (normal pieces) made UNUSED."""
    m = pb.ModelProto()
    m.ParseFromString(proto)
    found = 0
    for p in m.pieces:
        if p.piece in pieces:
            assert p.type == Type.NORMAL, p
            p.type = Type.UNUSED
            found += 1
    assert found == len(pieces), f"only {found} of {pieces} in the model"
    return m.SerializeToString()


def processor(proto: bytes) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_proto=proto)


def encode(sp: spm.SentencePieceProcessor, text: str) -> list:
    return sp.encode(text, add_bos=False, add_eos=False)


def piece_types(proto: bytes) -> dict:
    m = pb.ModelProto()
    m.ParseFromString(proto)
    return {p.piece: (i, p.type) for i, p in enumerate(m.pieces)}


def check_features(name: str, proto: bytes, cases: list) -> None:
    """Asserts the cases exercise what each model is for."""
    types = piece_types(proto)
    by_id = {i: (piece, t) for piece, (i, t) in types.items()}
    emitted = [by_id[i] for c in cases for i in c["ids"]]
    kinds = {t for _, t in emitted}
    if name == "gemma_like":
        assert Type.BYTE in kinds and Type.USER_DEFINED in kinds, kinds
        assert any(p == "▁▁▁▁" for p, _ in emitted), "runs of spaces"
        assert any(len(p) > 4 and t == Type.NORMAL for p, t in emitted), "long merges"
    if name == "nmt_nfkc":
        unk = types["<unk>"][0]
        assert Type.UNKNOWN in kinds and Type.BYTE not in kinds, kinds
        assert any(p == "①" for p, _ in emitted), "user-defined symbols kept from the character map"
        text = "ẞ Ω 🦀 ꙮ 𝔘𝔫𝔦 are not in the corpus"
        ids = next(c["ids"] for c in cases if c["text"] == text)
        assert ids.count(unk) >= 3, ids
    if name == "unused":
        # Merged unused pieces are split back; an unused character is unknown (bytes: "z" is <0x7A>).
        assert Type.UNUSED not in kinds, "unused pieces resegmented"
        assert any(p == "<0x7A>" for p, _ in emitted), "an unused character"


def main() -> None:
    assert spm.__version__ == VERSION, f"sentencepiece {spm.__version__}, expected {VERSION}"
    gemma = train(**GEMMA_LIKE)
    models = {
        "gemma_like": gemma,
        "nmt_nfkc": train(**NMT_NFKC),
        "unused": flip_unused(gemma, UNUSED),
    }
    # The pieces flipped to unused were produced before the flip, so resegmentation is exercised.
    before = {i for t in TEXTS for i in encode(processor(gemma), t)}
    gemma_types = piece_types(gemma)
    for piece in UNUSED:
        assert gemma_types[piece][0] in before, f"{piece!r} never appears in gemma_like's ids"

    OUT.mkdir(parents=True, exist_ok=True)
    models_json = []
    for name, proto in models.items():
        sp = processor(proto)
        specials = [sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()]
        assert specials == ([-1, 2, 1, 0] if name == "nmt_nfkc" else [0, 1, 2, 3]), specials
        cases = [{"text": t, "ids": encode(sp, t)} for t in TEXTS]
        check_features(name, proto, cases)
        (OUT / f"{name}.model.gz").write_bytes(gzip.compress(proto, 9, mtime=0))
        lines = ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases)
        head = json.dumps({"name": name, "pieces": sp.get_piece_size()})[:-1]
        models_json.append(f' {head}, "cases": [\n{lines}\n ]}}')
        print(f"{name}: {sp.get_piece_size()} pieces, {sum(len(c['ids']) for c in cases)} ids")
    text = f'{{"sentencepiece": "{spm.__version__}", "models": [\n' + ",\n".join(models_json) + "\n]}\n"
    json.loads(text)
    (OUT / "cases.json").write_text(text)


if __name__ == "__main__":
    main()
