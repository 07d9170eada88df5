"""Writes engine/tests/fixtures/video/: a tiny MP4 as common tools make it (x264 High profile with B-frames
and CABAC, AAC-LC stereo audio, FFmpeg's `use_metadata_tags`), and what FFmpeg decodes from it, for the test
that Kiln's decoding (OpenH264, Symphonia, its own MP4 reader) matches FFmpeg's.

Needs PyAV (its wheels bundle FFmpeg with libx264). Run: $python scripts/reference/video.py
"""

import json
import pathlib
from fractions import Fraction

import av
import numpy as np

OUT = pathlib.Path(__file__).resolve().parents[2] / "engine/tests/fixtures/video"
W, H, FRAMES, RATE = 48, 32, 12, 44100


def tagged():
    """`x264_bt709_full.mp4`: H.264 whose SPS declares BT.709 in full range (as phones tag their video), and
    FFmpeg's frames of it, converted by what it declares."""
    path = OUT / "x264_bt709_full.mp4"
    out = av.open(str(path), mode="w")
    video = out.add_stream("libx264", rate=24)
    video.width, video.height, video.pix_fmt = W, H, "yuv420p"
    video.options = {"crf": "20", "x264-params": "colormatrix=bt709:colorprim=bt709:transfer=bt709:fullrange=on"}
    yy, xx = np.mgrid[0:H, 0:W]
    for i in range(4):
        img = np.stack([(xx * 5 + i * 9) % 256, (yy * 7 + i * 5) % 256, ((xx + yy) * 4) % 256], -1)
        frame = av.VideoFrame.from_ndarray(img.astype(np.uint8), format="rgb24").reformat(format="yuv420p")
        out.mux(video.encode(frame))
    out.mux(video.encode(None))
    out.close()
    with av.open(str(path)) as container:
        decoded = list(container.decode(video=0))
        assert (decoded[0].colorspace, decoded[0].color_range) == (1, 2), "BT.709 full range"
        frames = [f.to_ndarray(format="rgb24") for f in decoded]
    np.stack(frames).astype(np.uint8).tofile(OUT / "x264_bt709_full_frames_rgb24.bin")
    print(f"wrote {path}: {path.stat().st_size} bytes, {len(frames)} frames")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    tagged()
    path = OUT / "x264_high_aac.mp4"
    out = av.open(str(path), mode="w", options={"movflags": "use_metadata_tags+faststart"})
    out.metadata["prompt"] = json.dumps({"1": {"class_type": "X"}})
    video = out.add_stream("libx264", rate=Fraction(30000, 1001))
    video.width, video.height, video.pix_fmt = W, H, "yuv420p"
    video.options = {"bframes": "3", "crf": "20"}
    audio = out.add_stream("aac", rate=RATE, layout="stereo")
    yy, xx = np.mgrid[0:H, 0:W]
    for i in range(FRAMES):
        img = np.stack([(xx * 5 + i * 9) % 256, (yy * 7 + i * 5) % 256, ((xx + yy) * 4) % 256], -1)
        frame = av.VideoFrame.from_ndarray(img.astype(np.uint8), format="rgb24").reformat(format="yuv420p")
        out.mux(video.encode(frame))
    out.mux(video.encode(None))
    t = np.arange(RATE // 2) / RATE
    wave = (np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 660 * t)]) * 0.5).astype(np.float32)
    frame = av.AudioFrame.from_ndarray(wave, format="fltp", layout="stereo")
    frame.sample_rate, frame.pts = RATE, 0
    out.mux(audio.encode(frame))
    out.mux(audio.encode(None))
    out.close()

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.profile == "High", stream.codec_context.profile
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == FRAMES
    np.stack(frames).astype(np.uint8).tofile(OUT / "frames_rgb24.bin")
    with av.open(str(path)) as container:
        samples = np.concatenate([f.to_ndarray() for f in container.decode(audio=0)], axis=1)
    np.ascontiguousarray(samples[:, :4096], dtype="<f4").tofile(OUT / "audio_head_f32.bin")
    (OUT / "expected.json").write_text(
        json.dumps(
            {
                "frames": FRAMES,
                "width": W,
                "height": H,
                "rate": [30000, 1001],
                "audio_channels": int(samples.shape[0]),
                "audio_samples": int(samples.shape[1]),
                "sample_rate": RATE,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {OUT}: {path.stat().st_size} bytes of MP4, {samples.shape[1]} audio samples")


if __name__ == "__main__":
    main()
