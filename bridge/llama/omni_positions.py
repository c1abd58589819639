"""Qwen3-Omni's M-RoPE positions for a prompt with images, audio clips and videos: transformers' `get_rope_index`
for the thinker (Qwen3OmniMoeThinkerForConditionalGeneration), in numpy, and the processor's audio-in-video
token layout that they follow. llama.cpp's mtmd cannot make them: it numbers a video's frames as consecutive
images and knows no audio-in-video.

- text: one position per token, the same on all three axes, resuming at the previous piece's maximum + 1;
- an image: (t, row, column) of each merged patch from the start, t = 0;
- a video: the same with t = frame pair x seconds_per_grid x position_id_per_seconds (13): at the reference's
  2 fps, seconds_per_grid = temporal_patch_size / fps = 1.0, so pair k sits at 13 k (the processor's own
  default fps 1.0 would give 26 k);
- audio: one position per token, sequential;
- audio in video (every video of the request has a soundtrack): `<|vision_start|><|audio_start|>`, then the
  video's and its soundtrack's tokens merged by their temporal position (video first on ties), then
  `<|audio_end|><|vision_end|>`; both start at the same position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

# Qwen3-Omni's thinker config; no GGUF key records it (neither converter writes one, gguf-py names none), so it is
# taken on trust: docs/media.md
POSITION_ID_PER_SECONDS = 13


@dataclass(frozen=True)
class OmniTokens:
    """The special token ids the positions depend on, read from the loaded model's vocabulary (Projector.omni_tokens):
    a fine-tune's or a test model's tokenizer may put them anywhere."""

    vision_start: int
    image: int
    video: int
    audio_start: int
    audio: int


def video_temporal(grid_t: int, rows: int, cols: int, seconds_per_grid: float,
                   per_second: int = POSITION_ID_PER_SECONDS) -> np.ndarray:
    """The temporal position (from the video's start) of each of a video's tokens, in token order."""
    return np.repeat(np.arange(grid_t) * seconds_per_grid * per_second, rows * cols)


def interleaved(video_t: np.ndarray, n_audio: int) -> tuple[np.ndarray, int]:
    """Audio in video: the order of a video's tokens (True) and its soundtrack's (False), merged by temporal position,
    video first on ties (the processor's replace_multimodal_special_tokens and get_rope_index alike), and how many
    were merged one by one before the rest of one kind follows as a block."""
    audio_t = np.arange(n_audio)
    out, v, a = [], 0, 0
    while v < len(video_t) and a < n_audio:
        if video_t[v] <= audio_t[a]:
            out.append(True)
            v += 1
        else:
            out.append(False)
            a += 1
    return np.array(out + [True] * (len(video_t) - v) + [False] * (n_audio - a), dtype=bool), v + a


def _vision(start: int, grid_t_index: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """[3, t * rows * cols] (t, row, column) + start, in token order."""
    t = np.repeat(grid_t_index, rows * cols)
    h = np.tile(np.repeat(np.arange(rows), cols), len(grid_t_index))
    w = np.tile(np.arange(cols), rows * len(grid_t_index))
    return np.stack([t, h, w]).astype(np.float64) + start


def _text(start: float, n: int) -> np.ndarray:
    return np.broadcast_to(np.arange(n, dtype=np.float64) + start, (3, n))


def rope_positions(input_ids: Sequence[int], image_grids: Sequence[Sequence[int]],
                   video_grids: Sequence[Sequence[int]], audio_tokens: Sequence[int],
                   seconds_per_grid: Sequence[float], audio_in_video: bool, *, tokens: OmniTokens, merge: int,
                   per_second: int = POSITION_ID_PER_SECONDS) -> np.ndarray:
    """int64 [3, T] positions of a prompt (get_rope_index's): grids are (t, h, w) in patches, before merging;
    audio_tokens: each audio item's token count in prompt order (the request's clips, then with audio in video
    the videos' soundtracks); tokens and merge: the model's own (its vocabulary's ids, its projector's merge)."""
    ids = np.asarray(input_ids)
    pieces: list[np.ndarray] = []
    images, videos, clips = iter(image_grids), iter(zip(video_grids, seconds_per_grid)), iter(audio_tokens)
    at = 0

    def next_start() -> float:
        return pieces[-1].max() + 1 if pieces else 0.0  # the LAST piece's maximum, as the reference

    while True:
        starts = np.flatnonzero((ids[at:] == tokens.vision_start) | (ids[at:] == tokens.audio_start))
        if not len(starts):
            break
        begin = at + int(starts[0])
        st = next_start()
        if begin > at:
            pieces.append(_text(st, begin - at))
            st += begin - at
        nested = ids[begin] == tokens.vision_start and begin + 1 < len(ids) and ids[begin + 1] == tokens.audio_start
        bos = 2 if nested else 1
        pieces.append(_text(st, bos))
        st += bos
        if ids[begin] == tokens.audio_start:  # an audio clip
            n = next(clips)
            pieces.append(_text(st, n))
            used = n
        elif ids[begin + 1] == tokens.image:
            t, h, w = next(images)
            pieces.append(_vision(st, np.arange(t, dtype=np.float64) * per_second, h // merge, w // merge))
            used = t * h * w // merge ** 2
        else:
            (t, h, w), spg = next(videos)
            rows, cols = h // merge, w // merge
            video = _vision(st, np.arange(t) * float(spg) * per_second, rows, cols)
            if ids[begin + 1] == tokens.video and not nested:
                pieces.append(video)
                used = t * h * w // merge ** 2
            else:
                n = next(clips)
                order, looped = interleaved(video[0] - st, n)
                merged = np.empty((3, len(order)))
                merged[:, order], merged[:, ~order] = video, _text(st, n)
                # the reference appends token by token, then the rest of one kind as one piece: the next start is
                # that last piece's maximum + 1
                cut = looped if looped < len(order) else looped - 1
                pieces += [merged[:, :cut], merged[:, cut:]]
                used = len(order)
        eos = bos
        pieces.append(_text(next_start(), eos))
        at = begin + bos + used + eos
    if at < len(ids):
        pieces.append(_text(next_start(), len(ids) - at))
    return np.concatenate([p for p in pieces if p.shape[1]], axis=1).astype(np.int64)


def order_keys(positions: np.ndarray) -> np.ndarray:
    """int64 [T]: each token's (t, row, column) as one integer ordered as llama.cpp's M-RoPE causal mask orders cells
    (llama-kv-cache.cpp: a cell is hidden from a token at a smaller t, or at the same t when is_2d_gt: a later row,
    or the same row and a later column)."""
    p = np.asarray(positions, dtype=np.int64)
    if p.size and (p.min() < 0 or p.max() >= 1 << 21):
        raise ValueError(f"positions from {p.min()} to {p.max()}: outside the 21 bits an order key gives each axis")
    return (p[0] << 42) | (p[1] << 21) | p[2]


def sees_by_order(positions: np.ndarray) -> np.ndarray:
    """bool [T]: the tokens from which llama.cpp's causal mask would hide an earlier token of the prompt (one whose
    order key is greater: a frame pair's later rows from the sound token sharing the pair's temporal position, in
    audio in video). The reference's mask is plain token order, so these are decoded one at a time with the causal
    mask off: the sequence's cells then hold exactly the tokens before them."""
    key = order_keys(positions)
    before = np.maximum.accumulate(np.concatenate([[-1], key[:-1]])) if len(key) else key
    return before > key


def rope_chunks(input_ids: Sequence[int], positions: np.ndarray, rows: dict[int, np.ndarray], width: int) -> list:
    """A prompt as backbone chunks (MediaChunk) at its M-RoPE positions ([3, T], rope_positions'): each pad token id
    in `rows` takes the next row of its array (images', audio items' or videos' rows, each in prompt order), the
    other tokens go in as ids. Rows narrower than width (audio: no deepstack slices) are zero-padded, as llama.cpp
    pads text tokens' embeddings.

    Every token attends to exactly the tokens before it, as in the reference. llama.cpp masks by position, not by
    order, so: a new chunk (a llama_decode of its own) wherever the kind of token changes or the order keys stop
    increasing (a token would otherwise see a later one of its own chunk), and each token of sees_by_order alone,
    with the causal mask off."""
    from .media_batch import MediaChunk

    ids = np.asarray(input_ids, dtype=np.int32)
    is_row = np.isin(ids, list(rows))
    taken = {pad: int((ids == pad).sum()) for pad in rows}
    short = {pad: (n, len(rows[pad])) for pad, n in taken.items() if n != len(rows[pad])}
    if short:
        raise ValueError(f"pad tokens and media rows differ (pad id: (tokens, rows)): {short}")
    embd = np.zeros((int(is_row.sum()), width), dtype=np.float32)
    order = ids[is_row]
    for pad, r in rows.items():
        embd[order == pad, :r.shape[1]] = r
    pos4 = np.concatenate([positions, np.zeros((1, len(ids)), np.int64)]).astype(np.int32)
    key, alone = order_keys(positions), sees_by_order(positions)
    kind = np.where(is_row, ids, -1)
    cut = (kind[1:] != kind[:-1]) | (key[1:] <= key[:-1]) | alone[1:] | alone[:-1]
    starts = [0, *(np.flatnonzero(cut) + 1).tolist()]
    chunks, used = [], 0
    for at, end in zip(starts, [*starts[1:], len(ids)]):
        if is_row[at]:
            chunks.append(MediaChunk(pos=pos4[:, at:end], embd=embd[used:used + end - at], causal=not alone[at]))
            used += end - at
        else:  # text: one position on all axes
            chunks.append(MediaChunk(pos=pos4[0, at:end], tokens=ids[at:end], causal=not alone[at]))
    return chunks
