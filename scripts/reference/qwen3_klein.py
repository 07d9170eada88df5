"""Fixtures for FLUX.2 Klein's text encoder (engine/models/tests/fixtures/qwen3_klein/): Qwen3 run over ComfyUI's
Klein chat template padded to 512 tokens, hidden states 9, 18 and 27 concatenated per token.

Run from the repository root:  $(scripts/reference/setup.sh) scripts/reference/qwen3_klein.py

Writes:
- weights.safetensors: a tiny transformers `Qwen3Model` with the real structure and 28 layers, so that the taps
  9, 18 and 27 are all inside the stack and none is the last layer's (transformers final-norms its last hidden
  state; ComfyUI's taps never are): hidden 32, MLP 64, 2 query heads over 1 key/value head of width 16, eps 1e-6,
  theta 1e6, vocab 1024; random weights seeded, stored as bf16 under the HF names.
- hidden.safetensors: for each case, `hidden.<name>` = [hidden_states[9] | hidden_states[18] |
  hidden_states[27]] [1, N, 96] f32 (HF numbering: index 0 the embeddings, index i the output of layer i - 1),
  computed in f32 from the bf16-rounded weights with eager attention and ComfyUI's attention mask (below).
- hidden.safetensors also holds `last.unpadded` = hidden_states[28] [1, 40, 32] of the unpadded case: the last
  layer's output, which transformers (and ComfyUI, for a tap equal to the layer count) give through the final norm.
- cases.json: per case the ids the tiny model runs on (`model_ids`: the real ids modulo its vocabulary of 1024),
  the real ids (`ids`) and `attended`, the number of leading ids ComfyUI attends to as keys.
- tokenizer_ids.json: for a set of prompts, the Klein ids: the python `tokenizers` library on the bundled
  tokenizer.json, of the prompt (after ComfyUI's weights-disabled pre-pass) in the Klein template, right-padded
  with <|endoftext|> (151643) to 512; checked against transformers' `Qwen2Tokenizer` applying Qwen3's chat
  template with `add_generation_prompt=True, enable_thinking=False`, padded the same way.

ComfyUI's mask (`sd1_clip.SDClipModel.process_tokens` with no end token, `llama.Llama2_.forward`): 1 for the ids
before the first 151643, 0 from it on (pads, and anything after a 151643 written in the prompt); the model adds
(1 - mask[key]) * finfo.min / 4 to the causal mask (triu(1) * finfo.min / 4), so every query attends causally to
the unmasked keys only, and every row, the pads' included, is computed and returned. The script builds that
additive 4D mask as ComfyUI does and passes it to transformers (which takes a 4D mask as given); it also checks
that transformers' own 2D padding mask gives the same states.

Independent references only (transformers, tokenizers); ComfyUI's rules re-derived from its source.
"""

import gzip
import json
import pathlib
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import Qwen3Config, Qwen3Model

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import qwen3 as q3  # noqa: E402  (the Qwen3 fixture's prompts, pre-pass and transformers tokenizer)

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "engine/models/tests/fixtures/qwen3_klein"
TOKENIZER = ROOT / "engine/models/data/qwen3-tokenizer/tokenizer.json.gz"

ENDOFTEXT = 151643
MIN_LENGTH = 512
TAPS = [9, 18, 27]
VOCAB = 1024

# The user turn and generation prompt of Qwen3's chat template (Qwen/Qwen3-4B `tokenizer_config.json`), the only
# parts a single user message without a system turn reaches.
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def klein_text(prompt: str) -> str:
    """ComfyUI's `KleinTokenizer.llama_template` around the pre-passed prompt."""
    return (
        "<|im_start|>user\n"
        + q3.unescape_parentheses(prompt)
        + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def pad(ids: list[int]) -> list[int]:
    """ComfyUI's `min_length=512` padding with `pad_token=151643`; it never truncates."""
    return ids + [ENDOFTEXT] * max(0, MIN_LENGTH - len(ids))


def attended(ids: list[int]) -> int:
    """How many leading ids ComfyUI's mask keeps: those before the first 151643."""
    return ids.index(ENDOFTEXT) if ENDOFTEXT in ids else len(ids)


def tokenizer_fixture(tok: Tokenizer) -> None:
    data = gzip.decompress(TOKENIZER.read_bytes()).decode("utf-8")
    check = q3.transformers_tokenizer(json.loads(data))
    check.chat_template = QWEN3_CHAT_TEMPLATE
    cases = []
    for prompt in q3.PROMPTS:
        ids = pad(tok.encode(klein_text(prompt), add_special_tokens=False).ids)
        messages = [{"role": "user", "content": q3.unescape_parentheses(prompt)}]
        text = check.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        assert text == klein_text(prompt), (prompt, text)
        want = pad(check(text)["input_ids"])
        assert ids == want, (prompt, ids, want)
        cases.append({"prompt": prompt, "klein": ids, "attended": attended(ids)})
    empty = cases[0]["klein"][:13]
    assert empty == [151644, 872, 198, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271, ENDOFTEXT], empty
    lines = ",\n".join(" " + json.dumps(case, ensure_ascii=False) for case in cases)
    (OUT / "tokenizer_ids.json").write_text("[\n" + lines + "\n]\n")


def comfy_mask(n: int, keep: int) -> torch.Tensor:
    """ComfyUI's additive mask [1, 1, n, n] (f32): finfo.min / 4 on masked keys and above the diagonal, summed."""
    low = torch.finfo(torch.float32).min / 4
    keys = torch.tensor([1.0] * keep + [0.0] * (n - keep))
    mask = (1.0 - keys).reshape(1, 1, 1, n).expand(1, 1, n, n).clone()
    mask = mask.masked_fill(mask.to(torch.bool), low)
    causal = torch.empty(n, n).fill_(low).triu_(1)
    return mask + causal


def model_fixture(tok: Tokenizer) -> None:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=28,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = Qwen3Model(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # Norm weights away from 1 so a norm applied with the wrong weight (or not at all) shows.
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name == "embed_tokens.weight":
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            # Kiln reads the bf16 file and widens exactly: compute from the same values.
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    weights = {"model." + k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(weights, OUT / "weights.safetensors")

    gen = torch.Generator().manual_seed(1)
    real = {
        # A short prompt in the Klein template, padded to 512: 495 pad rows.
        "klein": pad(tok.encode(klein_text("a photo of a cat"), add_special_tokens=False).ids),
        # An <|endoftext|> written in the prompt masks from there on, as in ComfyUI; unpadded here (min length 1).
        "written_endoftext": tok.encode(
            klein_text("before <|endoftext|> after"), add_special_tokens=False
        ).ids,
        # No 151643 at all: plain causal attention.
        "unpadded": torch.randint(0, VOCAB, (40,), generator=gen).tolist(),
    }
    cases = {}
    outputs = {}
    captured = {}
    hooks = [
        model.layers[t - 1].register_forward_hook(
            lambda _m, _i, out, t=t: captured.__setitem__(t, out[0] if isinstance(out, tuple) else out)
        )
        for t in TAPS
    ]
    with torch.no_grad():
        for name, ids in real.items():
            keep = attended(ids)
            model_ids = [i % VOCAB for i in ids]
            x = torch.tensor([model_ids])
            out = model(input_ids=x, attention_mask=comfy_mask(len(ids), keep), output_hidden_states=True)
            assert len(out.hidden_states) == config.num_hidden_layers + 1
            states = [out.hidden_states[t] for t in TAPS]
            # HF numbering pinned independently of transformers' recording: index t is layer t - 1's output.
            for t, s in zip(TAPS, states):
                assert torch.equal(captured[t].reshape(s.shape), s), (name, t)
            both = torch.cat(states, dim=-1).to(torch.float32).contiguous()
            # transformers' own padding mask agrees with ComfyUI's additive one.
            plain = model(
                input_ids=x,
                attention_mask=torch.tensor([[1] * keep + [0] * (len(ids) - keep)]),
                output_hidden_states=True,
            )
            again = torch.cat([plain.hidden_states[t] for t in TAPS], dim=-1)
            assert torch.allclose(again, both, rtol=0, atol=1e-5 * both.abs().max()), name
            outputs[f"hidden.{name}"] = both
            if name == "unpadded":
                last = out.hidden_states[config.num_hidden_layers]
                assert torch.equal(last, out.last_hidden_state)
                outputs["last.unpadded"] = last.to(torch.float32).contiguous()
            cases[name] = {"model_ids": model_ids, "ids": ids, "attended": keep}
    for h in hooks:
        h.remove()
    assert cases["klein"]["attended"] < MIN_LENGTH and len(cases["klein"]["ids"]) == MIN_LENGTH
    assert 0 < cases["written_endoftext"]["attended"] < len(cases["written_endoftext"]["ids"])
    assert cases["unpadded"]["attended"] == 40
    save_file(outputs, OUT / "hidden.safetensors")
    (OUT / "cases.json").write_text(json.dumps(cases) + "\n")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    data = gzip.decompress(TOKENIZER.read_bytes()).decode("utf-8")
    tok = Tokenizer.from_str(data)
    tokenizer_fixture(tok)
    model_fixture(tok)


if __name__ == "__main__":
    main()
