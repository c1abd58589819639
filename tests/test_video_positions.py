"""A video's M-RoPE positions on non-square grids and with the timing the prompt plan derives (bridge/model/
video_prompt.py, bridge/llama/omni_positions.py), without the oracle's environment: rows and columns kept apart
(a square grid cannot tell them), seconds_per_grid from the frames' rate (the processor's temporal_patch_size / fps
= 2 / 2.0 = 1.0 s: frame pair k at 13 k), never passed by hand. The expected numbers follow transformers'
get_rope_index for Qwen3-Omni, written out: t = pair x seconds_per_grid x 13, then row, then column, from the
video's start; tests/test_video_reference.py compares the reference's own."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.bridge.llama.omni_positions import POSITION_ID_PER_SECONDS, OmniTokens, rope_positions
from clef_bridge.bridge.media.audio_tower import audio_tokens
from clef_bridge.bridge.media.video import FPS, DecodedVideo
from clef_bridge.bridge.model.video_prompt import video_prompt

pytestmark = pytest.mark.unit

V, VS, VE, AS, AE, A = 151656, 151652, 151653, 151669, 151670, 151675
FACTOR, MERGE = 32, 2  # Qwen3-Omni's vision tower: 16-pixel patches merged 2 x 2
TOKENS = OmniTokens(vision_start=VS, image=151655, video=V, audio_start=AS, audio=A)


def expected_vision(start: int, pairs: int, rows: int, cols: int, seconds_per_grid: float) -> np.ndarray:
    """[3, pairs * rows * cols]: (t, row, column) + start of each merged patch, row by row, pair by pair."""
    t, r, c = np.meshgrid(np.arange(pairs) * seconds_per_grid * POSITION_ID_PER_SECONDS, np.arange(rows),
                          np.arange(cols), indexing="ij")
    return np.stack([t.ravel(), r.ravel(), c.ravel()]).astype(np.int64) + start


@pytest.mark.parametrize("rows, cols", [(2, 3), (3, 2), (1, 5)])
def test_a_non_square_videos_rows_and_columns_are_its_own(rows, cols):
    ids = [1, 2, VS] + [V] * (2 * rows * cols) + [VE, 3]
    got = rope_positions(ids, [], [(2, rows * MERGE, cols * MERGE)], [], [1.0], False, tokens=TOKENS,
                         merge=MERGE)
    video = got[:, 3:3 + 2 * rows * cols]
    assert np.array_equal(video, expected_vision(3, 2, rows, cols, 1.0))
    assert got[:, 3 + rows * cols].tolist() == [3 + 13, 3, 3]  # the second pair restarts at row 0, column 0
    after = int(video.max()) + 1  # the text after resumes past the largest position, on all three axes
    assert got[:, -2].tolist() == [after] * 3 and got[:, -1].tolist() == [after + 1] * 3


def frames(n: int, height: int, width: int) -> np.ndarray:
    return np.zeros((n, height, width, 3), np.uint8)


def prompt_ids(plan, text_before: int = 2) -> list[int]:
    """A prompt holding the plan's one video as the encoder writes it: its tokens in the plan's layout."""
    [layout] = plan.layouts
    body = [V if is_video else A for is_video in layout]
    markup = ([VS, AS], [AE, VE]) if plan.audio_in_video else ([VS], [VE])
    return list(range(1, text_before + 1)) + markup[0] + body + markup[1] + [7]


def test_seconds_per_grid_is_derived_from_the_frames_rate_and_places_each_pair():
    """2 fps frames, the processor's temporal patch of 2: 1.0 s per grid, pair k at 13 k; a 64 x 96 clip is
    upscaled to 320 x 448 pixels: 10 rows by 14 columns of tokens per pair."""
    plan = video_prompt([DecodedVideo(frames(6, 64, 96), None)], [], FACTOR, MERGE)
    assert plan.seconds_per_grid == (2 / FPS,) == (1.0,) and plan.grids == ((3, 20, 28),)
    ids = prompt_ids(plan)
    got = rope_positions(ids, [], plan.grids, plan.audio_counts, plan.seconds_per_grid, plan.audio_in_video,
                         tokens=TOKENS, merge=MERGE)
    start = 3
    video = got[:, start:start + 3 * 10 * 14]
    assert np.array_equal(video, expected_vision(start, 3, 10, 14, 1.0))
    assert sorted(set(video[0].tolist())) == [start, start + 13, start + 26]


def test_a_soundtracks_tokens_fall_between_the_pairs_at_the_derived_timing():
    """Audio in video: the frames of pair k (at 13 k) come before the sound tokens from 13 k on (video first on
    ties), so the layout itself depends on seconds_per_grid."""
    seconds = 3.0
    clip = DecodedVideo(frames(6, 32, 64), np.zeros(round(seconds * 16000), np.float32))
    plan = video_prompt([clip], [], FACTOR, MERGE)
    [n_sound] = audio_tokens([len(clip.audio)])
    assert plan.audio_in_video and plan.audio_counts == (n_sound,) and n_sound > 26
    rows, cols = plan.grids[0][1] // MERGE, plan.grids[0][2] // MERGE
    assert rows != cols
    per_pair = rows * cols
    want = [True] * per_pair + [False] * 13 + [True] * per_pair + [False] * 13 + [True] * per_pair
    want += [False] * (n_sound - 26)
    assert list(plan.layouts[0]) == want
    ids = prompt_ids(plan)
    got = rope_positions(ids, [], plan.grids, plan.audio_counts, plan.seconds_per_grid, plan.audio_in_video,
                         tokens=TOKENS, merge=MERGE)
    start = 4  # two text tokens, then <|vision_start|><|audio_start|>
    body = got[:, start:start + len(want)]
    is_video = np.array(want)
    assert np.array_equal(body[:, is_video], expected_vision(start, 3, rows, cols, 1.0))
    assert body[0, ~is_video].tolist() == list(range(start, start + n_sound))  # sound: one position per token
