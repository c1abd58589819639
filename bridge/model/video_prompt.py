"""A request's videos as Clef-omni's prompt holds them: frames at the tower's size, frame grids, the audio-in-video
rule and each video's token layout (the reference's processor and get_rope_index; bridge/llama/omni_positions.py).

The reference passes `use_audio_in_video` only when EVERY video of the request has a soundtrack; then the tracks
are audio items after the request's clips (the feature extractor pads all of them to the longest: a clip's
token count depends on the tracks too), and each video's frame and sound tokens interleave by time. Otherwise
the soundtracks are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..llama.omni_positions import interleaved, video_temporal
from ..media.audio_tower import audio_tokens
from ..media.video import DecodedVideo, tower_frames, tower_geometry


@dataclass(frozen=True)
class VideoPrompt:
    frames: tuple[np.ndarray, ...]  # uint8 [n, H, W, 3] per video, at the tower's size
    grids: tuple[tuple[int, int, int], ...]  # (t, h, w) in patches per video: t = frame pairs
    seconds_per_grid: tuple[float, ...]
    audio_in_video: bool
    audio: tuple[np.ndarray, ...]  # the audio items: the request's clips, then the soundtracks with audio in video
    audio_counts: tuple[int, ...]  # tokens per audio item
    layouts: tuple[tuple[bool, ...], ...]  # per video: each token a video token (True) or a sound token (False)
    merge: int  # the projector's spatial merge: one token per merge x merge patches

    @property
    def clip_counts(self) -> tuple[int, ...]:
        """The request's own clips' token counts (the soundtracks' are inside the videos' layouts)."""
        return self.audio_counts[:len(self.audio) - (len(self.frames) if self.audio_in_video else 0)]


def video_prompt(videos: Sequence[DecodedVideo], clips: Sequence[np.ndarray], factor: int, merge: int) -> VideoPrompt:
    """The prompt plan of a request's videos beside its audio clips (16 kHz samples), for a tower of this factor
    (patch x merge pixels per token side) and merge (its projector's)."""
    frames = tuple(tower_frames(v.frames, tower_geometry(factor)) for v in videos)
    patch = factor // merge
    grids = tuple((len(f) // 2, f.shape[1] // patch, f.shape[2] // patch) for f in frames)
    spg = tuple(v.seconds_per_grid for v in videos)
    in_video = bool(videos) and all(v.audio is not None for v in videos)
    items = tuple(clips) + (tuple(v.audio for v in videos) if in_video else ())
    counts = tuple(audio_tokens([len(x) for x in items]))
    tracks = counts[len(clips):]
    layouts = []
    for i, (t, h, w) in enumerate(grids):
        n_video = t * (h // merge) * (w // merge)
        if in_video:
            order, _ = interleaved(video_temporal(t, h // merge, w // merge, spg[i]), tracks[i])
            layouts.append(tuple(bool(x) for x in order))
        else:
            layouts.append((True,) * n_video)
    return VideoPrompt(frames, grids, spg, in_video, items, counts, tuple(layouts), merge)
