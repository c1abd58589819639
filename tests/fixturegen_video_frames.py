"""The reference's answers for videos sent as frame arrays and with media_kwargs, built into .fixtures/video/frames/
and reused while the spec, the oracle scripts and the inputs' bytes are unchanged.

The frame arrays are tests/fixturegen_video.py's synthetic frames (gradients, a moving square, noise), saved as .npy;
tests/video_frames_oracle.py runs the reference on them in the video oracle environment (tests/fixturegen_video.py
builds it: torch 2.13, torchvision 0.28, transformers 5.20.2), the arrays handed over as a JSON body carries them.
Kept apart from fixturegen_video's cases, whose answers the other video tests read: adding these reruns nothing there.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import fixturegen_omni, fixturegen_video
from .fixturegen import FIXTURES, ROOT, _lock

ORACLE_SCRIPT = ROOT / "tests" / "video_frames_oracle.py"


@dataclass(frozen=True)
class Frames:
    """A frame array: n frames of width x height, fixturegen_video's synthetic pixels for this seed."""

    n: int
    width: int
    height: int
    seed: int

    def pixels(self) -> np.ndarray:
        clip = fixturegen_video.Clip("", "", "", None, self.width, self.height, 2, self.n / 2, seed=self.seed)
        return np.stack([fixturegen_video.frame_pixels(clip, i) for i in range(self.n)])


# Small enough for a body's JSON containers (bridge/server/body.py json_containers: 279,744 arrays and objects at the
# default limits; a frame array of n x h x w pixels opens about n x h x w): all of a request's frames together
ARRAYS = {
    # at the tower's size already (sides multiples of 32, 133,120 pixels within 131,072..786,432): not resized
    "tower_2": Frames(2, 416, 320, seed=21),
    # 20,480 pixels: upscaled by the processor to 416 x 352 (where its int64 path and ours part: see frames.py)
    "small_4": Frames(4, 160, 128, seed=22),
    # 3 frames (odd: padded with the last), upscaled from 192 x 160
    "odd_3": Frames(3, 192, 160, seed=23),
}


@dataclass(frozen=True)
class Case:
    """A request's videos in order: ("frames", an ARRAYS name) or ("clip", a fixturegen_video clip name)."""

    videos: tuple[tuple[str, str], ...]
    media_kwargs: dict[str, Any] | None = None


CASES = {
    "frames_tower": Case((("frames", "tower_2"),)),
    "frames_small": Case((("frames", "small_4"),)),
    "frames_odd": Case((("frames", "odd_3"),)),
    # the processor's fps 1.0: each frame pair spans 2 s, pair k at temporal position 26 k
    "frames_fps1": Case((("frames", "small_4"),), {"videos_kwargs": {"fps": 1.0, "do_sample_frames": False}}),
    "frames_two": Case((("frames", "small_4"), ("frames", "odd_3"))),
    # beside a sounded clip: no audio in video for either (a frame array has no soundtrack)
    "frames_beside_sounded": Case((("clip", "mp4_sounded_big"), ("frames", "small_4"))),
    # a sounded clip at fps 0.5 (pair k at 52 k, its sound tokens between), use_audio_in_video as the rule gives
    "sounded_fps_half": Case((("clip", "mp4_sounded_big"),), {"videos_kwargs": {"fps": 0.5,
                                                                               "use_audio_in_video": True}}),
    # the reference's own options sent back: nothing changes
    "sounded_own_options": Case((("clip", "mp4_sounded_big"),), {
        "videos_kwargs": {"fps": 2.0, "do_sample_frames": False, "use_audio_in_video": True},
        "images_kwargs": {"size": {"shortest_edge": 65536, "longest_edge": 1048576}}}),
}


@dataclass(frozen=True)
class FrameFixtures:
    arrays: dict[str, Path]  # .npy files: uint8 [n, h, w, 3]
    clips: dict[str, Path]
    answers: Path

    def load(self) -> dict[str, Any]:
        return json.loads(self.answers.read_text())

    def frames(self, name: str) -> np.ndarray:
        return np.load(self.arrays[name])


def _spec(omni: fixturegen_omni.OmniFixtures, arrays: dict[str, Path], clips: dict[str, Path], out: Path) -> dict:
    from .omni_cases import SCHEMA, STATE
    from .omni_reference import REFERENCE_SHA256, reference_file

    base = {"model": "clef-omni", "state": STATE, "questions": SCHEMA}
    cases = {name: {"record": base, "media_kwargs": case.media_kwargs,
                    "videos": [{"frames": str(arrays[n])} if kind == "frames" else {"clip": str(clips[n])}
                               for kind, n in case.videos]} for name, case in CASES.items()}
    return {"reference": str(reference_file()), "reference_sha256": REFERENCE_SHA256, "model": str(omni.hf_model),
            "head": str(omni.head), "image_processor": fixturegen_omni.IMAGE_PROCESSOR,
            "video_processor": fixturegen_video.VIDEO_PROCESSOR,
            "feature_extractor": fixturegen_video.FEATURE_EXTRACTOR, "cases": cases, "out": str(out)}


def _stamp(spec: dict) -> str:
    """What the answers depend on: the spec, both oracle scripts and the inputs' bytes."""
    h = hashlib.sha256(json.dumps(spec, sort_keys=True).encode() + ORACLE_SCRIPT.read_bytes()
                       + fixturegen_video.ORACLE_SCRIPT.read_bytes())
    for case in spec["cases"].values():
        for entry in case["videos"]:
            h.update(Path(entry.get("clip") or entry["frames"]).read_bytes())
    return h.hexdigest()


def build(root: Path = FIXTURES / "video" / "frames") -> FrameFixtures:
    vfx = fixturegen_video.build()  # the clips, the oracle environment, the tiny Qwen3-Omni
    omni = fixturegen_omni.build()
    with _lock(root):
        arrays = {}
        for name, frames in ARRAYS.items():
            path = root / f"{name}.npy"
            if not path.exists():
                np.save(root / f"{name}.tmp.npy", frames.pixels())
                (root / f"{name}.tmp.npy").rename(path)
            arrays[name] = path
        out = root / "reference"
        spec = _spec(omni, arrays, vfx.clips, out)
        fx = FrameFixtures(arrays, vfx.clips, out / "answers.json")
        fixturegen_video.run_oracle(vfx.root, ORACLE_SCRIPT, spec, out, _stamp(spec),
                                    f"{len(CASES)} frame-array and media_kwargs cases")
        return fx


if __name__ == "__main__":
    print(build(), file=sys.stderr)
