"""Writes engine/tests/fixtures/webm/: two tiny WebM files as FFmpeg makes them, and what FFmpeg decodes from
them, for the test that Kiln's WebM reading (its Matroska reader, rusty_vp9, opus-decoder, Symphonia's Vorbis)
matches FFmpeg's.

- `libvpx_opus.webm`: libvpx-vp9 with its defaults (alt-ref frames, so hidden frames in superframes), Opus
  stereo audio, the prompt as a tag; a file as FFmpeg writes it (known sizes, cues).
- `live_vorbis.webm`: libvpx-vp9 and Vorbis stereo audio written with the muxer's `live` option: clusters of
  unknown size, as browsers' MediaRecorder and live recorders write them.

- `chromium_mediarecorder.webm` (recorded by scripts/reference/mediarecorder.mjs, run first): Chromium's
  MediaRecorder output, VP9 tagged BT.709 full range with Opus; FFmpeg's first frames and audio are written.

Needs PyAV (its wheels bundle FFmpeg with libvpx and libopus; Vorbis is FFmpeg's own encoder). Run: $python scripts/reference/webm.py
"""

import json
import pathlib
from fractions import Fraction

import av
import numpy as np

OUT = pathlib.Path(__file__).resolve().parents[2] / "engine/tests/fixtures/webm"
W, H, FRAMES = 48, 32, 12


def picture(i):
    yy, xx = np.mgrid[0:H, 0:W]
    img = np.stack([(xx * 5 + i * 9) % 256, (yy * 7 + i * 5) % 256, ((xx + yy) * 4) % 256], -1)
    return av.VideoFrame.from_ndarray(img.astype(np.uint8), format="rgb24").reformat(format="yuv420p")


def write(name, audio_codec, rate, layout, options):
    path = OUT / name
    out = av.open(str(path), mode="w", format="webm", options=options)
    out.metadata["prompt"] = json.dumps({"1": {"class_type": "X"}})
    video = out.add_stream("libvpx-vp9", rate=Fraction(30000, 1001))
    video.width, video.height, video.pix_fmt = W, H, "yuv420p"
    video.bit_rate = 0
    video.options = {"crf": "30"}
    audio = out.add_stream(audio_codec, rate=rate, layout=layout)
    audio.options = {"strict": "-2"}  # FFmpeg's own Vorbis encoder is experimental
    for i in range(FRAMES):
        out.mux(video.encode(picture(i)))
    out.mux(video.encode(None))
    channels = 2 if layout == "stereo" else 1
    t = np.arange(rate // 2) / rate
    wave = np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 660 * t)][:channels]) * 0.5
    fmt = audio.codec_context.format.name
    chunk = audio.codec_context.frame_size or 1024
    for at in range(0, wave.shape[1], chunk):
        part = wave[:, at:at + chunk]
        part = (part * 32767).astype(np.int16) if fmt.startswith("s16") else part.astype(np.float32)
        part = np.ascontiguousarray(part)
        if not fmt.endswith("p"):
            part = part.T.reshape(1, -1).copy()
        frame = av.AudioFrame.from_ndarray(part, format=fmt, layout=layout)
        frame.sample_rate, frame.pts = rate, at
        out.mux(audio.encode(frame))
    out.mux(audio.encode(None))
    out.close()

    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == FRAMES, len(frames)
    stem = name.removesuffix(".webm")
    np.stack(frames).astype(np.uint8).tofile(OUT / f"{stem}_frames_rgb24.bin")
    with av.open(str(path)) as container:
        decoded = [f for f in container.decode(audio=0)]
        samples = np.concatenate([f.to_ndarray().reshape(channels, -1) if f.format.is_planar
                                  else f.to_ndarray().reshape(-1, channels).T for f in decoded], axis=1)
        out_rate = decoded[0].sample_rate
    np.ascontiguousarray(samples[:, :4096], dtype="<f4").tofile(OUT / f"{stem}_audio_head_f32.bin")
    print(f"wrote {path}: {path.stat().st_size} bytes, {samples.shape[1]} audio samples at {out_rate} Hz")
    return {
        "frames": FRAMES,
        "width": W,
        "height": H,
        "rate": [30000, 1001],
        "audio_channels": int(samples.shape[0]),
        "audio_samples": int(samples.shape[1]),
        "sample_rate": int(out_rate),
    }


def chromium():
    """What FFmpeg decodes from the browser's recording: its first frames (by the colour space and range the
    stream declares) and the head of its sound."""
    path = OUT / "chromium_mediarecorder.webm"
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        first = container.streams.video[0]
    np.stack(frames[:4]).astype(np.uint8).tofile(OUT / "chromium_mediarecorder_frames_rgb24.bin")
    with av.open(str(path)) as container:
        decoded = list(container.decode(audio=0))
        samples = np.concatenate([f.to_ndarray() for f in decoded], axis=1)
    np.ascontiguousarray(samples[:, :4096], dtype="<f4").tofile(OUT / "chromium_mediarecorder_audio_head_f32.bin")
    height, width = frames[0].shape[:2]
    return {"frames": len(frames), "width": width, "height": height, "audio_channels": int(samples.shape[0]),
            "audio_samples": int(samples.shape[1]), "sample_rate": int(decoded[0].sample_rate)}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    expected = {
        "libvpx_opus": write("libvpx_opus.webm", "libopus", 48000, "stereo", {}),
        "live_vorbis": write("live_vorbis.webm", "vorbis", 44100, "stereo", {"live": "1"}),
        "chromium_mediarecorder": chromium(),
    }
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
