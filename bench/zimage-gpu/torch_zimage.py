"""The PyTorch/diffusers side of the Z-Image-Turbo benchmark (issue #11): the same synthetic safetensors files
Kiln runs (`kiln model synth`, ComfyUI's layout), loaded into diffusers' `ZImageTransformer2DModel` and
`AutoencoderKL` and transformers' `Qwen3Model` (keys converted by plain renames, the fused qkv split), every
model resident on the device (what `ZImagePipeline.to("cuda")` does), then the default workflow's work: encode
the prompt (hidden state -2, Qwen3 chat template, Kiln's bundled tokenizer), `steps` flow-matching steps at
shift 3 (one DiT call each, as ComfyUI's res_multistep at cfg 1; plain Euler here: the same calls, the sampler's
arithmetic is negligible), VAE decode. Writes JSON: load, encode, per-step, decode and end-to-end seconds (cold:
the first prompt, loading included; warm: another seed with the prompt embeddings cached, as ComfyUI's cache
keeps them), peak device memory (torch's allocator and the driver), peak host RSS.

The loop is written here rather than through `ZImagePipeline` because the pipeline wants a tokenizer and
scheduler from the Hub (no network on the GPU machine); the models are diffusers' and transformers' own.

Usage: python3 torch_zimage.py --models DIR [--size 1024] [--steps 8] [--device cuda|cpu] --out FILE.json
(on the CPU it computes in f32: a dry run with `kiln model synth --size tiny` files).
"""
import argparse
import gzip
import json
import os
import pathlib
import resource
import sys
import time

import torch
from safetensors import safe_open

DIT_FILE = "diffusion_models/z_image_turbo_bf16.safetensors"
TE_FILE = "text_encoders/qwen_3_4b.safetensors"
VAE_FILE = "vae/ae.safetensors"
PROMPT = "anime RPG game style, cute anime girl"
TOKENIZER = pathlib.Path(__file__).resolve().parents[2] / "engine/models/data/qwen3-tokenizer/tokenizer.json.gz"
FLUX_SCALE, FLUX_SHIFT = 0.3611, 0.1159


def read(path):
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def rss_peak_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def h2d_pinned_gbps(dev):
    """The link bandwidth the partial-residency goal divides by: pinned H2D, 1 GiB, median of 5 (after 2
    warm-ups); the device's peak memory statistics are reset after."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(n, dtype=torch.uint8, device=dev)
    ts = []
    for _ in range(7):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); dst.copy_(src, non_blocking=True); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return n / sorted(ts[2:])[2] / 1e9


def finish(res, out_path):
    """Adds the device's and the process's peak memory to `res`, writes it to `out_path` and prints it."""
    if torch.cuda.is_available() and res.get("device", "").startswith("cuda"):
        res["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        res["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        free, total = torch.cuda.mem_get_info()
        res["driver_used_at_end_bytes"] = total - free
    res["peak_rss_bytes"] = rss_peak_bytes()
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))
    for r in res["runs"]:
        print(json.dumps({k: v for k, v in r.items() if k != "step_seconds"}))


def step_figures(out, steps):
    """The per-step figures of one run: every step, their median, and the median after the first."""
    out["step_seconds"] = steps
    out["step_seconds_median"] = sorted(steps)[len(steps) // 2]
    rest = sorted(steps[1:])
    out["step_seconds_median_after_first"] = rest[len(rest) // 2] if rest else None


def dequantized(sd, dtype, dev):
    """ComfyUI's legacy scaled fp8 (weight-formats.md §3.2) widened on the device, one tensor at a time (the host
    holds the fp8 file, never a wide copy): each `<L>.weight` with a `<L>.scale_weight` is W.float() · scale, every
    tensor then cast to `dtype`; the `scaled_fp8` marker and any `scale_input` are dropped, and the q/k-norm gains'
    `.scale` renamed `.weight` (ComfyUI's rename on load)."""
    scales = {k[:-len(".scale_weight")]: sd.pop(k) for k in list(sd) if k.endswith(".scale_weight")}
    for k in [k for k in sd if k == "scaled_fp8" or k.endswith(".scale_input") or k.startswith("__")]:
        del sd[k]
    state = {}
    for k in list(sd):
        t = sd.pop(k).to(dev)
        layer = k[:-len(".weight")] if k.endswith(".weight") else None
        if layer in scales:
            t = t.float() * scales.pop(layer).to(dev, torch.float32)
        if k.endswith(("query_norm.scale", "key_norm.scale")):
            k = k[:-len(".scale")] + ".weight"
        state[k] = t.to(dtype)
    if scales:
        raise ValueError(f"scale_weight without a weight: {list(scales)[:5]}")
    return state


def pixels(decoded):
    """A VAE's output in [-1, 1] as 8-bit pixels on the host (the work a SaveImage does before encoding)."""
    return ((decoded.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu()


def flow_sigmas(shift, steps):
    """ComfyUI's `simple` schedule of a flow model at `shift` (sigmas of the 1000-step table, evenly spaced)."""
    table = [shift * (t / 1000) / (1 + (shift - 1) * (t / 1000)) for t in range(1, 1001)]
    return [table[-1 - int(i * 1000 / steps)] for i in range(steps)] + [0.0]


# ---- DiT: ComfyUI layout -> diffusers ZImageTransformer2DModel (models.md §2.3) ----

def dit_to_diffusers(sd):
    out = {}
    glob = {"x_embedder.": "all_x_embedder.2-1.", "final_layer.": "all_final_layer.2-1."}
    for name, t in sd.items():
        if ".attention.qkv." in name:
            q, k, v = t.chunk(3, dim=0)
            for part, x in (("to_q", q), ("to_k", k), ("to_v", v)):
                out[name.replace(".qkv.", f".{part}.")] = x
            continue
        new = name.replace(".attention.out.", ".attention.to_out.0.")
        new = new.replace(".attention.q_norm.", ".attention.norm_q.")
        new = new.replace(".attention.k_norm.", ".attention.norm_k.")
        for a, b in glob.items():
            if new.startswith(a):
                new = b + new[len(a):]
        out[new] = t
    return out


def build_dit(sd, dtype, dev):
    from diffusers import ZImageTransformer2DModel
    from diffusers.models.transformers.transformer_z_image import TimestepEmbedder

    dim, cap = sd["cap_embedder.1.weight"].shape
    head_dim = sd["layers.0.attention.q_norm.weight"].shape[0]
    count = lambda g: len({k.split(".")[1] for k in sd if k.startswith(g + ".")})
    with torch.device("meta"):
        model = ZImageTransformer2DModel(
            all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=dim,
            n_layers=count("layers"), n_refiner_layers=count("noise_refiner"),
            n_heads=dim // head_dim, n_kv_heads=dim // head_dim, norm_eps=1e-5, qk_norm=True,
            cap_feat_dim=cap, rope_theta=256.0, t_scale=1000.0,
            axes_dims=[head_dim // 4, head_dim * 3 // 8, head_dim * 3 // 8], axes_lens=[1536, 512, 512],
        )
        t_hidden, t_freq = sd["t_embedder.mlp.0.weight"].shape
        model.t_embedder = TimestepEmbedder(sd["t_embedder.mlp.2.weight"].shape[0], mid_size=t_hidden)
    assign(model, dit_to_diffusers(sd), dtype)
    return model.to(dev).eval()


def assign(model, state, dtype):
    """Sets every parameter from `state` (its own shape: diffusers derives the FFN width as int(8/3·dim), the
    synthetic tiny files use ComfyUI's rounding to 256), and checks none is left unset."""
    for name, t in state.items():
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, torch.nn.Parameter(t.to(dtype), requires_grad=False))
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise ValueError(f"parameters the file does not set: {left[:5]}")


# ---- Qwen3 text encoder: the file is transformers' layout under `model.` ----

def build_te(sd, dtype, dev):
    from transformers import Qwen3Config, Qwen3Model

    vocab, hidden = sd["model.embed_tokens.weight"].shape
    head_dim = sd["model.layers.0.self_attn.q_norm.weight"].shape[0]
    layers = len({k.split(".")[2] for k in sd if k.startswith("model.layers.")})
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=sd["model.layers.0.self_attn.q_proj.weight"].shape[0] // head_dim,
        num_key_value_heads=sd["model.layers.0.self_attn.k_proj.weight"].shape[0] // head_dim,
        head_dim=head_dim, intermediate_size=sd["model.layers.0.mlp.gate_proj.weight"].shape[0],
        rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960, tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = Qwen3Model(config)
    state = {k[len("model."):]: v.to(dtype) for k, v in sd.items() if k.startswith("model.")}
    model.load_state_dict(state, strict=False, assign=True)
    # Buffers (rotary inv_freq) were built on meta: rebuild them before moving.
    model.rotary_emb = type(model.rotary_emb)(config=config)
    return model.to(dev).eval()


# ---- Flux VAE: LDM layout -> diffusers AutoencoderKL ----

def ldm_name(name, levels):
    """diffusers AutoencoderKL name -> ComfyUI/LDM name (as scripts/reference/flux_vae.py)."""
    side, rest = name.split(".", 1)
    renames = [
        ("mid_block.resnets.0.", "mid.block_1."), ("mid_block.resnets.1.", "mid.block_2."),
        ("mid_block.attentions.0.group_norm.", "mid.attn_1.norm."),
        ("mid_block.attentions.0.to_q.", "mid.attn_1.q."), ("mid_block.attentions.0.to_k.", "mid.attn_1.k."),
        ("mid_block.attentions.0.to_v.", "mid.attn_1.v."),
        ("mid_block.attentions.0.to_out.0.", "mid.attn_1.proj_out."), ("conv_norm_out.", "norm_out."),
    ]
    for old, new in renames:
        if rest.startswith(old):
            rest = new + rest[len(old):]
    p = rest.split(".")
    if p[0] == "down_blocks":
        i = int(p[1])
        rest = ".".join(["down", str(i), "block"] + p[3:]) if p[2] == "resnets" else \
            ".".join(["down", str(i), "downsample"] + p[4:])
    elif p[0] == "up_blocks":
        i = levels - 1 - int(p[1])
        rest = ".".join(["up", str(i), "block"] + p[3:]) if p[2] == "resnets" else \
            ".".join(["up", str(i), "upsample"] + p[4:])
    return f"{side}.{rest.replace('conv_shortcut', 'nin_shortcut')}"


def build_vae(sd, dtype, dev):
    from diffusers import AutoencoderKL

    ch = sd["encoder.conv_in.weight"].shape[0]
    levels = len({k.split(".")[2] for k in sd if k.startswith("encoder.down.")})
    mult = [sd[f"encoder.down.{i}.block.0.conv1.weight"].shape[0] // ch for i in range(levels)]
    blocks = len({k.split(".")[4] for k in sd if k.startswith("encoder.down.0.block.")})
    model = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=sd["decoder.conv_in.weight"].shape[1],
        block_out_channels=[ch * m for m in mult], layers_per_block=blocks,
        down_block_types=("DownEncoderBlock2D",) * levels, up_block_types=("UpDecoderBlock2D",) * levels,
        norm_num_groups=32, use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True,
    )
    state = {}
    for name, param in model.state_dict().items():
        t = sd[ldm_name(name, levels)]
        state[name] = t.reshape(param.shape).to(dtype)
    model.load_state_dict(state, strict=True)
    return model.to(dev, dtype).eval()  # load_state_dict kept the model's f32 parameters


def tokenize(prompt):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(gzip.decompress(TOKENIZER.read_bytes()).decode())
    text = "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n"
    return tok.encode(text, add_special_tokens=False).ids


def setup(bench, default_size, sampler, modules, extra_options=None):
    """The command line (`--models DIR [--size N] [--steps N] [--device cuda|cpu] --out FILE`, and what
    `extra_options(parser)` adds), the device and
    compute dtype (bf16 on CUDA, f32 on the CPU), and the report started: versions of torch and `modules`
    (an import failure is reported, not fatal), and on CUDA the GPU, TF32 on and the pinned H2D bandwidth.
    Returns (args, device, dtype, models folder, report)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True)
    ap.add_argument("--size", type=int, default=default_size)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    if extra_options:
        extra_options(ap)
    args = ap.parse_args()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    res = {"bench": bench, "torch": torch.__version__, "device": str(dev), "dtype": str(dtype),
           "size": args.size, "steps": args.steps, "sampler": sampler, "runs": []}
    try:
        for name in modules:
            res[name] = __import__(name).__version__
    except Exception as e:  # reported, not fatal: the build step fails with the reason
        res["import_error"] = repr(e)
    if dev.type == "cuda":
        res["gpu"] = torch.cuda.get_device_name(0)
        torch.backends.cuda.matmul.allow_tf32 = True
        res["h2d_pinned_1GiB_GBps"] = h2d_pinned_gbps(dev)
    return args, dev, dtype, pathlib.Path(args.models), res


def cold_and_warm(res, run, loaded, out_path):
    """Runs `run` for the first prompt (loading included) and another seed, records the loaded models'
    weight bytes, writes the report (what ran so far, with the error, if one failed) and exits 1 on an error."""
    try:
        res["runs"].append(run(42, "cold"))
        res["runs"].append(run(43, "warm"))
        res["weights_bytes"] = {k: sum(p.numel() * p.element_size() for p in m.parameters())
                                for k, m in loaded.items() if hasattr(m, "parameters")}
    except Exception:  # the figures so far still go out
        import traceback
        res["error"] = traceback.format_exc()
        print(res["error"], file=sys.stderr)
    finish(res, out_path)
    sys.exit(1 if "error" in res else 0)


def main():
    args, dev, dtype, models, res = setup("zimage-torch", 1024, "euler (flow, shift 3)",
                                          ("diffusers", "transformers"))

    ids = torch.tensor([tokenize(PROMPT)], device=dev)
    h = w = args.size // 8
    sigmas = flow_sigmas(3.0, args.steps)

    loaded = {}

    def run(seed, label):
        out = {"label": label, "seed": seed}
        t_all = time.perf_counter()
        if not loaded:
            for key, file, build in (("te", TE_FILE, build_te), ("dit", DIT_FILE, build_dit),
                                     ("vae", VAE_FILE, build_vae)):
                t = time.perf_counter()
                loaded[key] = build(read(models / file), dtype, dev)
                sync(dev)
                out[f"load_{key}_s"] = time.perf_counter() - t
        te, dit, vae = loaded["te"], loaded["dit"], loaded["vae"]
        with torch.no_grad():
            if "cap" not in loaded:
                t = time.perf_counter()
                hidden = te(input_ids=ids, output_hidden_states=True).hidden_states[-2]
                loaded["cap"] = hidden[0].to(dtype)
                sync(dev)
                out["encode_s"] = time.perf_counter() - t
            cap = loaded["cap"]
            g = torch.Generator("cpu").manual_seed(seed)
            x = torch.randn(1, 16, h, w, generator=g).to(dev, torch.float32)
            x = x * sigmas[0]
            steps = []
            t_sample = time.perf_counter()
            for i in range(args.steps):
                t = time.perf_counter()
                sigma, nxt = sigmas[i], sigmas[i + 1]
                tt = torch.tensor([1.0 - sigma], device=dev, dtype=dtype)
                v = dit([x[0].to(dtype).unsqueeze(1)], tt, [cap], return_dict=False)[0][0][:, 0]
                # ComfyUI's output is -v (ε - x0); Euler in σ.
                x = x + (nxt - sigma) * (-v.float()).unsqueeze(0)
                sync(dev)
                steps.append(time.perf_counter() - t)
            out["sample_s"] = time.perf_counter() - t_sample
            t = time.perf_counter()
            image = vae.decode((x / FLUX_SCALE + FLUX_SHIFT).to(dtype)).sample
            image = pixels(image)
            out["decode_s"] = time.perf_counter() - t
        step_figures(out, steps)
        out["seconds"] = time.perf_counter() - t_all
        out["image_shape"] = list(image.shape)
        return out

    cold_and_warm(res, run, loaded, args.out)


if __name__ == "__main__":
    main()
