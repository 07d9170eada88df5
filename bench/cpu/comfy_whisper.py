"""ComfyUI's AudioEncoderEncode on the CPU, for the Whisper large-v3 figures beside Kiln's `--workflow whisper` bench
(bench/results/2026-12-03-whisper-cpu-real.md): ComfyUI at 0f1fa67a (COMFYUI_DIR) loads the file as its
AudioEncoderLoader does and encodes one second of the bench's 440 Hz tone at 24 kHz, twice (the first run warms
torch), printing JSON with the load time and each encode's seconds.

    COMFYUI_DIR=... OMP_NUM_THREADS=2 target/reference-venv/bin/python bench/cpu/comfy_whisper.py FILE
(the reference venv of scripts/reference/setup.sh with torchaudio==2.11.1; see scripts/reference/whisper.py).
"""

import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "reference"))
from comfyui import import_comfyui  # noqa: E402


def main(path):
    import_comfyui(node_modules=True)
    import comfy.audio_encoders.audio_encoders as encoders
    import comfy.model_patcher  # noqa: F401 (audio_encoders reads it as an attribute of comfy)
    import comfy.utils

    started = time.perf_counter()
    encoder = encoders.load_audio_encoder_from_sd(comfy.utils.load_torch_file(path, safe_load=True))
    load_s = time.perf_counter() - started
    rate = 24000
    tone = torch.tensor([math.sin(2 * math.pi * 440 * i / rate) for i in range(rate)]) * (8000 / 32768)
    waveform = tone.view(1, 1, -1)
    runs = []
    with torch.inference_mode():
        for _ in range(2):
            started = time.perf_counter()
            out = encoder.encode_audio(waveform, rate)
            runs.append(time.perf_counter() - started)
    print(json.dumps({
        "load_seconds": load_s,
        "encode_seconds": runs,
        "states": len(out["encoded_audio_all_layers"]),
        "dtype": str(out["encoded_audio"].dtype),
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main(sys.argv[1])
