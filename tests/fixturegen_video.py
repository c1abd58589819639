"""The video fixtures, built into .fixtures/video/ and reused when present.

- small clips made with PyAV (mp4/H.264 + AAC, WebM/VP9 + Opus, Matroska/MPEG-4 + MP3; silent and sounded; an
  odd number of frames at 2 fps; a frame over the reference's 262,144-pixel cap; frames under 131,072 pixels);
- the oracle environment, `.fixtures/video/oracle/` (a venv of its own): the reference's video path needs
  transformers' Qwen2VLVideoProcessor, which needs torchvision, which loads only beside the index's default
  (CUDA) torch 2.13 build, not beside the CPU wheel the test venv carries. pip installs it blind to the local
  find-links (the `+cpu` wheel sorts above the plain version): about 5 GB, 2 minutes here, 15 on a slow link;
- the reference's answers for the video cases on the tiny random Qwen3-Omni (fixturegen_omni), computed by
  tests/video_oracle.py run as a subprocess in that environment, in `answers.json` (and `arrays.npz`: the
  processor's pixels and the vision tower's output for two clips).

The oracle pins transformers 5.20.2: 5.24 deprecated the processor's `use_audio_in_video` (now
`load_audio_from_video`) and the reference's call then fails for a video with a soundtrack ("Found total 0
<|audio_pad|> tokens and 1 audio inputs"); 5.20.2 is contemporary with the clef-omni release (ollajev 0.4.0
requires transformers >= 5.19). `CLEF_VIDEO_ORACLE_PYTHON` names another interpreter with those pins instead
(a shared copy while developing). Run `python -m tests.fixturegen_video` by hand; the video tests build it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from . import fixturegen_omni
from .fixturegen import FIXTURES, ROOT, _lock, _log

ORACLE_PINS = ("torch==2.13.0", "torchvision==0.28.0", "transformers==5.20.2", "av==18.1.0", "numpy==2.4.6",
               "safetensors==0.8.0", "pillow==13.0.0")
ORACLE_SCRIPT = ROOT / "tests" / "video_oracle.py"
# Qwen3-Omni's released preprocessor_config.json gives min_pixels 3,136 / max_pixels 12,845,056 (Qwen2-VL's
# bounds) and no video_preprocessor_config.json: the video processor is built from those keys, pinned here. Yet
# the processor passes its own defaults (Qwen3OmniMoeProcessorKwargs: 131,072..786,432) to the video processor as
# call arguments, and under transformers 5.20.2 they win: the 320 x 240 clip's frames become 448 x 320, not
# 320 x 256 (tests/test_video_reference.py). The bridge sizes frames as the reference run does.
VIDEO_PROCESSOR = {"size": {"shortest_edge": 3136, "longest_edge": 12845056}, "patch_size": 16,
                   "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                   "image_std": [0.5, 0.5, 0.5]}
FEATURE_EXTRACTOR = dict(feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300, n_fft=400,
                         padding_value=0.0, return_attention_mask=True)


@dataclass(frozen=True)
class Clip:
    """A test clip: container and codecs, frame size and rate, length, and whether it has a soundtrack."""

    container: str  # PyAV's format name
    suffix: str
    video_codec: str
    audio_codec: str | None  # None: silent
    width: int
    height: int
    fps: int
    seconds: float
    audio_rate: int = 44100
    seed: int = 0
    layout: str = "stereo"  # the soundtrack's channels: mono, stereo, 5.1
    pix_fmt: str = "yuv420p"
    vfr: bool = False  # variable frame rate: frame i at a jittered time (fps is then the time base's rate)
    audio_seconds: float | None = None  # the soundtrack's length when it is not the video's
    rotation: int = 0  # the display matrix's counter-clockwise rotation (a phone's portrait shot stored landscape)

    @property
    def frames(self) -> int:
        return round(self.fps * self.seconds)

    @property
    def ticks(self) -> int:
        """Time-base units per frame period: 4 for a variable rate (frames land between the periods)."""
        return 4 if self.vfr else 1

    def pts(self, i: int) -> int:
        """Frame i's time in time-base units: whole periods, or jittered by up to half a period."""
        return self.ticks * i + ((i * 7) % 5 - 2 if self.vfr and i else 0)

    @property
    def end_s(self) -> float:
        """When the last frame ends: its time plus one frame period."""
        return (self.pts(self.frames - 1) + self.ticks) / (self.ticks * self.fps)

    @property
    def channels(self) -> int:
        return {"mono": 1, "stereo": 2, "5.1": 6}[self.layout]


CLIPS = {
    # 15 frames at 10 fps: 3 kept at 2 fps (odd: padded to 4); 76,800 pixels, under 131,072
    "mp4_silent_small": Clip("mp4", ".mp4", "libx264", None, 320, 240, 10, 1.5, seed=1),
    # 307,200 pixels: scaled down to 592 x 444 by the reference
    "mp4_sounded_big": Clip("mp4", ".mp4", "libx264", "aac", 640, 480, 12, 2.0, seed=2),
    "webm_sounded": Clip("webm", ".webm", "libvpx-vp9", "libopus", 256, 192, 8, 1.0, audio_rate=48000, seed=3),
    # 15 frames at 6 fps: 5 kept (odd); 120,000 pixels, under 131,072
    "mkv_sounded": Clip("matroska", ".mkv", "mpeg4", "libmp3lame", 400, 300, 6, 2.5, seed=4),
    # issue 38's clips, made as a user's files come: MPEG-4 at 30 fps, 147,456 pixels (no scaling at all)
    "mp4_mpeg4_30fps": Clip("mp4", ".mp4", "mpeg4", None, 512, 288, 30, 2.0, seed=5),
    # 3 frames kept (padded to 4), scaled down, AAC 44.1 kHz stereo
    "mp4_h264_aac_3f": Clip("mp4", ".mp4", "libx264", "aac", 640, 480, 25, 1.5, seed=6),
    # lossless FFV1 + 16 kHz mono PCM at 10 fps: 6 frames, 3 pairs, a soundtrack of exactly 3 x 13 tokens
    "mkv_ffv1_pcm": Clip("matroska", ".mkv", "ffv1", "pcm_s16le", 384, 384, 10, 3.0, audio_rate=16000, seed=7,
                         layout="mono"),
    # VP9 + Opus 48 kHz at 12 fps: 5 frames kept (padded to 6)
    "webm_vp9_opus_5f": Clip("webm", ".webm", "libvpx-vp9", "libopus", 480, 352, 12, 2.5, audio_rate=48000, seed=8),
    # one frame (a clip shorter than one temporal patch: padded to a pair), 8 kHz mono PCM
    "mkv_1frame_8k": Clip("matroska", ".mkv", "ffv1", "pcm_s16le", 320, 320, 5, 0.4, audio_rate=8000, seed=9,
                          layout="mono"),
    # two frames, odd sides (FFV1 in 4:4:4 takes them), 5.1 AAC at 48 kHz
    "mkv_2frames_odd_51": Clip("matroska", ".mkv", "ffv1", "aac", 333, 187, 4, 1.0, audio_rate=48000, seed=10,
                               layout="5.1", pix_fmt="yuv444p"),
    # variable frame rate (jittered timestamps), silent, portrait
    # a soundtrack (MP3, 22.05 kHz mono) that stops long before the frames: the last pairs follow as one block
    "mp4_short_sound": Clip("mp4", ".mp4", "libx264", "libmp3lame", 352, 288, 8, 3.0, audio_rate=22050, seed=12,
                            layout="mono", audio_seconds=0.8),
    "mkv_vfr_portrait": Clip("matroska", ".mkv", "mpeg4", None, 288, 512, 8, 2.2, seed=11, vfr=True),
    # a phone's portrait clip: 640 x 360 stored, a display matrix of 90 degrees (the MP4's tkhd matrix), H.264 + AAC
    # 48 kHz mono at 30 fps; the reference's PyAV reads the rotation but hands the frames over as stored
    "mp4_phone_rot90": Clip("mp4", ".mp4", "libx264", "aac", 640, 360, 30, 2.0, audio_rate=48000, seed=13,
                            layout="mono", rotation=90),
    # issue 48: portrait frames 16 token rows high (rows 14 and 15 pass sound token 13, which ties pair 1), FFV1 +
    # 16 kHz PCM, 4 pairs; and a longer clip (10 pairs at 44.1 kHz AAC) whose every pair ties a sound token
    "mkv_portrait_sounded": Clip("matroska", ".mkv", "ffv1", "pcm_s16le", 288, 512, 4, 4.0, audio_rate=16000,
                                 seed=14, layout="mono"),
    "mp4_long_sounded": Clip("mp4", ".mp4", "libx264", "aac", 320, 240, 10, 10.0, seed=15),
}


def frame_pixels(clip: Clip, i: int) -> np.ndarray:
    """Frame i of a clip: gradients, a square that moves with time and noise (uint8 [h, w, 3])."""
    rng = np.random.default_rng(clip.seed * 1000 + i)
    y, x = np.mgrid[0:clip.height, 0:clip.width].astype(np.float32)
    img = np.stack([x / clip.width * 255, y / clip.height * 255, np.full_like(x, (i * 37 + clip.seed * 50) % 256)],
                   axis=-1)
    side = min(clip.width, clip.height) // 3
    at = (i * 13) % max(1, clip.width - side)
    img[clip.height // 3:clip.height // 3 + side, at:at + side] = (255 - 20 * (i % 8), 40 * (i % 5), 200)
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def soundtrack(clip: Clip) -> np.ndarray:
    """float32 [channels, n]: a chirp on the first channel, a tone on the second, other tones on the rest (5.1),
    seeded noise on all."""
    n = round((clip.audio_seconds or clip.seconds) * clip.audio_rate)
    t = np.arange(n) / clip.audio_rate
    rng = np.random.default_rng(clip.seed)
    left = 0.3 * np.sin(2 * np.pi * (220 + 200 * clip.seed + 150 * t) * t)
    rest = [0.2 * np.sin(2 * np.pi * (660 + 100 * clip.seed + 250 * c) * t) for c in range(clip.channels - 1)]
    return (np.stack([left, *rest]) + 0.02 * rng.standard_normal((clip.channels, n))).astype(np.float32)


def write_clip(clip: Clip, path: Path) -> None:
    import av

    with av.open(str(path), "w", format=clip.container) as out:
        video = out.add_stream(clip.video_codec, rate=clip.fps)
        video.width, video.height, video.pix_fmt = clip.width, clip.height, clip.pix_fmt
        video.codec_context.time_base = Fraction(1, clip.ticks * clip.fps)
        if clip.rotation:
            video.set_display_rotation(clip.rotation)
        audio = out.add_stream(clip.audio_codec, rate=clip.audio_rate) if clip.audio_codec else None
        if audio is not None:
            audio.layout = clip.layout
        for i in range(clip.frames):
            frame = av.VideoFrame.from_ndarray(frame_pixels(clip, i), format="rgb24")
            frame.pts = clip.pts(i)
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
        if audio is not None:
            samples = soundtrack(clip)
            step = 960 if clip.audio_codec == "libopus" else 1152 if clip.audio_codec == "libmp3lame" else 1024
            for at in range(0, samples.shape[1], step):
                part = np.ascontiguousarray(samples[:, at:at + step])
                frame = av.AudioFrame.from_ndarray(part.reshape(1, -1, order="F"), format="flt", layout=clip.layout)
                frame.sample_rate, frame.pts = clip.audio_rate, at
                out.mux(audio.encode(frame))
            out.mux(audio.encode(None))


@dataclass(frozen=True)
class VideoCase:
    """One reference request: its images (PNG files), audio clips (WAV files) and videos (clip names)."""

    images: tuple[str, ...] = ()
    audio: tuple[str, ...] = ()
    videos: tuple[str, ...] = ()
    media_kwargs: dict[str, Any] | None = None


CASES = {
    "text": VideoCase(),
    "video_silent": VideoCase(videos=("mp4_silent_small",)),
    "video_sounded": VideoCase(videos=("mp4_sounded_big",)),
    "video_webm": VideoCase(videos=("webm_sounded",)),
    "video_mkv": VideoCase(videos=("mkv_sounded",)),
    "video2": VideoCase(videos=("mp4_sounded_big", "webm_sounded")),  # both sounded: audio in video for both
    "video2_one_silent": VideoCase(videos=("mp4_silent_small", "mkv_sounded")),  # no audio in video at all
    "video_image_audio": VideoCase(images=("image_300x200.png",), audio=("tone_1.7.wav",), videos=("mkv_sounded",)),
    # the processor's own fps (1.0) instead of the reference's 2.0: each frame pair spans 2 s of positions
    "video_sounded_fps1": VideoCase(videos=("mp4_sounded_big",),
                                    media_kwargs={"videos_kwargs": {"do_sample_frames": False,
                                                                    "use_audio_in_video": True}}),
    # issue 38's cases, and more of the kind
    "mpeg4_30fps": VideoCase(videos=("mp4_mpeg4_30fps",)),
    "h264_aac_3f": VideoCase(videos=("mp4_h264_aac_3f",)),
    "ffv1_pcm": VideoCase(videos=("mkv_ffv1_pcm",)),
    "vp9_opus_5f": VideoCase(videos=("webm_vp9_opus_5f",)),
    "image_audio_silent_video": VideoCase(images=("image_300x200.png",), audio=("tone_1.7.wav",),
                                          videos=("mp4_mpeg4_30fps",)),
    "two_sounded": VideoCase(videos=("mp4_h264_aac_3f", "mkv_ffv1_pcm")),
    "silent_beside_sounded": VideoCase(videos=("mp4_mpeg4_30fps", "webm_vp9_opus_5f")),
    "one_frame_8k": VideoCase(videos=("mkv_1frame_8k",)),
    "two_frames_odd_51": VideoCase(videos=("mkv_2frames_odd_51",)),
    "vfr_portrait": VideoCase(videos=("mkv_vfr_portrait",)),
    "short_sound": VideoCase(videos=("mp4_short_sound",)),
    "rotated_phone": VideoCase(videos=("mp4_phone_rot90",)),
    "portrait_sounded": VideoCase(videos=("mkv_portrait_sounded",)),
    "long_sounded": VideoCase(videos=("mp4_long_sounded",)),
    "portrait_beside_long": VideoCase(videos=("mkv_portrait_sounded", "mp4_long_sounded")),
}
ISSUE38 = ("mpeg4_30fps", "h264_aac_3f", "ffv1_pcm", "vp9_opus_5f", "image_audio_silent_video", "two_sounded",
           "silent_beside_sounded", "one_frame_8k", "two_frames_odd_51", "vfr_portrait", "short_sound",
           "rotated_phone")


@dataclass(frozen=True)
class VideoFixtures:
    root: Path
    clips: dict[str, Path]
    answers: Path  # the reference's answers per case (answers.json)
    arrays: Path  # arrays.npz: the processor's pixels and the vision tower's rows for some cases

    def load(self) -> dict[str, Any]:
        return json.loads(self.answers.read_text())


def build_clips(root: Path) -> dict[str, Path]:
    out = root / "clips"
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, clip in CLIPS.items():
        path = out / f"{name}{clip.suffix}"
        if not path.exists():
            write_clip(clip, path.with_suffix(".tmp" + clip.suffix))
            path.with_suffix(".tmp" + clip.suffix).rename(path)
        paths[name] = path
    from .fixturegen_vision import encoded, picture
    from .omni_cases import tone, wav

    extra = {"image_300x200.png": lambda: encoded(picture(300, 200, seed=1), "PNG"),
             "tone_1.7.wav": lambda: wav(tone(1.70037, 3))}
    for name, make in extra.items():
        if not (out / name).exists():
            (out / name).write_bytes(make())
        paths[name] = out / name
    return paths


def oracle_python(root: Path) -> Path:
    """The oracle environment's interpreter, made when missing (pip blind to the local find-links and config)."""
    given = os.environ.get("CLEF_VIDEO_ORACLE_PYTHON")
    if given:
        return Path(given)
    venv = root / "oracle"
    python = venv / "bin" / "python"
    if (venv / "pins.txt").exists() and (venv / "pins.txt").read_text() == "\n".join(ORACLE_PINS):
        return python
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_CONFIG_FILE", "VIRTUAL_ENV")}
    env["PIP_CONFIG_FILE"] = os.devnull
    _log(f"building the video oracle environment in {venv} ({', '.join(ORACLE_PINS)}): about 5 GB, 2 to 15 min")
    subprocess.run(["python3", "-m", "venv", "--clear", str(venv)], check=True, env=env)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *ORACLE_PINS], check=True, env=env)
    (venv / "pins.txt").write_text("\n".join(ORACLE_PINS))
    return python


def _spec(fx: fixturegen_omni.OmniFixtures, clips: dict[str, Path], out: Path) -> dict[str, Any]:
    from .omni_cases import SCHEMA, STATE
    from .omni_reference import REFERENCE_SHA256, reference_file

    base = {"model": "clef-omni", "state": STATE, "questions": SCHEMA}
    cases = {name: {"record": base, "images": [str(clips[i]) for i in case.images],
                    "audio": [str(clips[a]) for a in case.audio], "videos": [str(clips[v]) for v in case.videos],
                    "media_kwargs": case.media_kwargs} for name, case in CASES.items()}
    return {"reference": str(reference_file()), "reference_sha256": REFERENCE_SHA256, "model": str(fx.hf_model),
            "head": str(fx.head), "image_processor": fixturegen_omni.IMAGE_PROCESSOR,
            "video_processor": VIDEO_PROCESSOR, "feature_extractor": FEATURE_EXTRACTOR, "cases": cases,
            "arrays_for": ["video_silent", "video_sounded", *ISSUE38], "out": str(out)}


def _stamp(spec: dict[str, Any]) -> str:
    """What the answers depend on: the spec, the oracle script and the clips' bytes."""
    h = hashlib.sha256(json.dumps(spec, sort_keys=True).encode() + ORACLE_SCRIPT.read_bytes())
    for case in spec["cases"].values():
        for path in case["images"] + case["audio"] + case["videos"]:
            h.update(Path(path).read_bytes())
    return h.hexdigest()


def build(root: Path = FIXTURES / "video") -> VideoFixtures:
    omni = fixturegen_omni.build()
    with _lock(root):
        clips = build_clips(root)
        out = root / "reference"
        spec = _spec(omni, clips, out)
        fx = VideoFixtures(root, clips, out / "answers.json", out / "arrays.npz")
        run_oracle(root, ORACLE_SCRIPT, spec, out, _stamp(spec), f"{len(CASES)} video cases")
        return fx


def run_oracle(root: Path, script: Path, spec: dict[str, Any], out: Path, stamp: str, what: str) -> None:
    """script on spec in the oracle environment, into out, unless out's stamp says it ran on the same inputs."""
    if (out / "stamp").exists() and (out / "stamp").read_text() == stamp:
        return
    python = oracle_python(root)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec, indent=1))
    _log(f"running the reference on {what} in the oracle environment")
    subprocess.run([str(python), str(script), str(out / "spec.json")], check=True)
    (out / "stamp").write_text(stamp)


if __name__ == "__main__":
    print(build(), file=sys.stderr)
