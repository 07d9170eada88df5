"""Fixtures for Kiln's Qwen2.5-VL language model, the text encoder of Qwen-Image
(engine/models/tests/fixtures/qwen25vl/).

Run from the repository root:  $(scripts/reference/setup.sh) scripts/reference/qwen25vl.py

Writes:
- weights.safetensors: the language model of a tiny transformers `Qwen2_5_VLForConditionalGeneration` with the
  released structure (q/k/v with biases, no q/k norm, rotate-half RoPE with M-RoPE sections scaled to the head,
  theta 1e6, eps 1e-6, SwiGLU; head dim 128 as released) at hidden 256, MLP 384, 2 layers, 2 query / 1 key-value
  heads, vocab 1024, random weights seeded, stored as bf16 under ComfyUI's names (`model.embed_tokens.weight`,
  `model.layers.*`, `model.norm.weight`: transformers' `model.language_model.*` renamed). The vision tower is
  not written (Kiln's text path does not read it).
- hidden.safetensors: for each case, `hidden.<name>` = the language model's last hidden state (after the final
  norm: `hidden_states[-1]`, ComfyUI's `layer="last"`) [1, N, 256] f32, computed in f32 from the bf16-rounded
  weights with eager attention, text only (every M-RoPE position the token index).
- cases.json: the cases' synthetic token ids (< 1024).

Independent references only (transformers); no ComfyUI code.
"""

import json
import pathlib

import torch
from safetensors.torch import save_file
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "engine/models/tests/fixtures/qwen25vl"
CASES = {
    "short": [7, 300, 42],
    "sixteen": [(i * 37 + 5) % 1024 for i in range(16)],
    "one": [999],
}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(25)
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=1024,
            hidden_size=256,
            intermediate_size=384,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_theta": 1e6, "rope_type": "default", "mrope_section": [16, 24, 24]},
            max_position_embeddings=4096,
        ),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=256),
        attn_implementation="eager",
    )
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    lm = model.model.language_model
    stored = {}
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            s = p.to(torch.bfloat16)
            p.copy_(s.float())
            stored["model." + name] = s.contiguous()
    save_file(stored, str(OUT / "weights.safetensors"))

    hidden = {}
    with torch.no_grad():
        for case, ids in CASES.items():
            out = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
            hidden[f"hidden.{case}"] = out.hidden_states[-1].float().contiguous()
            assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    save_file(hidden, str(OUT / "hidden.safetensors"))
    (OUT / "cases.json").write_text(json.dumps(CASES, indent=1) + "\n")
    for k, v in hidden.items():
        print(k, tuple(v.shape), float(v.abs().max()))
    print(sorted(stored)[:14])


if __name__ == "__main__":
    main()
