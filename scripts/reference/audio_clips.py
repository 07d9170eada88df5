"""The synthetic audio the audio-encoder reference scripts (whisper.py, wav2vec2.py) feed ComfyUI."""

import math

import torch


def clip(channels, samples, rate, g, gain=1.0, channel_offset=0.0):
    """[channels, samples] within [-1, 1] (times `gain`): two tones and a chirp per channel, and a little noise
    drawn from `g`; channel c shifted by c x `channel_offset`."""
    t = torch.arange(samples, dtype=torch.float64) / rate
    out = []
    for c in range(channels):
        f1, f2 = 220.0 * (c + 1), 1750.0 + 400.0 * c
        x = (0.35 * torch.sin(2 * math.pi * f1 * t) + 0.2 * torch.sin(2 * math.pi * f2 * t + 0.3 * c)
             + 0.15 * torch.sin(2 * math.pi * (300.0 * t + 1500.0 * t * t)))
        x = x + 0.05 * torch.randn(samples, generator=g, dtype=torch.float64)
        out.append(gain * x.clamp(-1, 1) + channel_offset * c)
    return torch.stack(out).float()
