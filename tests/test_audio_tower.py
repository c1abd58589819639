"""bridge/media/audio_tower.py's front end pinned to transformers' WhisperFeatureExtractor, built as Qwen3-Omni's
processor builds it (tests/fixturegen_omni.feature_extractor), on clips where its details show: silence, loud and
quiet parts (the log-mel floor at max - 8 cuts the quiet frames), and a request whose shorter clip is padded to
the longest (the periodic Hann window and the frame count at the padded end). The tower itself is checked against
transformers' in tests/test_omni.py."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.bridge.media.audio_tower import SAMPLE_RATE, mel_filters, request_features, request_frames

from . import fixturegen_omni

pytestmark = pytest.mark.slow  # transformers' import takes seconds

N_MEL = 128  # Qwen3-Omni's num_mel_bins


def tone(seconds: float, hz: float, amplitude: float) -> np.ndarray:
    t = np.arange(round(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def loud_then_quiet() -> np.ndarray:
    """0.4 s of a loud chord, 0.4 s of faint noise, 0.2 s of digital silence: the floor cuts the last two."""
    rng = np.random.default_rng(0)
    chord = tone(0.4, 440, 0.6) + tone(0.4, 2637, 0.3)
    faint = (1e-5 * rng.standard_normal(round(0.4 * SAMPLE_RATE))).astype(np.float32)
    return np.concatenate([chord, faint, np.zeros(round(0.2 * SAMPLE_RATE), np.float32)])


REQUESTS = {  # the clips of one request
    "silence": [np.zeros(SAMPLE_RATE, np.float32)],
    "loud then quiet": [loud_then_quiet()],
    "a short loud clip padded to a long quiet one": [tone(0.3, 1000, 0.9) + tone(0.3, 60, 0.05),
                                                     (1e-3 * np.random.default_rng(1).standard_normal(27233))
                                                     .astype(np.float32)],
    "off the frame grid": [tone(0.5, 300, 0.2)[:8077], loud_then_quiet()[:16001]],
}


@pytest.fixture(scope="module")
def extractor():
    return fixturegen_omni.feature_extractor()


def references(extractor, clips) -> list[np.ndarray]:
    """The processor's features of each clip of one request, the frames its attention mask keeps: [n_mel, f_i]."""
    out = extractor(clips, sampling_rate=SAMPLE_RATE, padding=True, truncation=False, return_attention_mask=True,
                    return_tensors="np")
    feats, mask = out["input_features"], out["attention_mask"][:, :out["input_features"].shape[-1]]
    return [f[:, m.astype(bool)] for f, m in zip(feats, mask)]


def test_the_mel_filters_are_the_extractors(extractor):
    assert np.abs(mel_filters(N_MEL) - extractor.mel_filters).max() < 1e-12


def errors(ours: np.ndarray, theirs: np.ndarray) -> dict[str, float]:
    """The largest difference in three bands of the reference's values (scaled log10 units: 1.0 is 10^4 in power):
    the loud ones (within 10^4 of the clip's loudest), the floor (10^8 below it) and the rest between them."""
    top = theirs.max()
    loud, floor = theirs >= top - 1.0, theirs <= top - 2.0 + 1e-6
    diff = np.abs(ours - theirs)
    return {band: float(diff[m].max()) if m.any() else 0.0
            for band, m in (("loud", loud), ("floor", floor), ("between", ~loud & ~floor))}


# The extractor computes in float32 (torch.stft), ours in float64: they agree to ~1e-6 on the loud values and at
# the floor; a quieter value inherits float32's error on its frame's loud bins (up to 1.5e-5 here, as much as
# the extractor's own numpy path differs from its torch path on the same clips).
TOLERANCE = {"loud": 2e-6, "floor": 1e-6, "between": 3e-5}


@pytest.mark.parametrize("name", REQUESTS)
def test_features_equal_the_whisper_extractors(extractor, name):
    clips = REQUESTS[name]
    theirs = references(extractor, clips)
    ours = request_features(clips, mel_filters(N_MEL))
    assert [f.shape[1] for f in ours] == [f.shape[1] for f in theirs] == request_frames([len(c) for c in clips])
    for mine, ref in zip(ours, theirs):
        assert mine.dtype == np.float32 and mine.shape == ref.shape
        worst = errors(mine, ref)
        assert all(worst[band] < TOLERANCE[band] for band in TOLERANCE), worst


def test_the_clips_exercise_the_floor_and_the_padding(extractor):
    """What makes the comparison above bite: frames at the floor next to loud ones, and padded frames."""
    [quiet] = references(extractor, REQUESTS["loud then quiet"])
    floor = quiet.max() - 2.0  # max - 8 in log10 units, after (x + 4) / 4
    assert np.isclose(quiet.min(), floor, atol=1e-6) and (quiet <= floor + 1e-6).mean() > 0.1
    short, long_ = references(extractor, REQUESTS["a short loud clip padded to a long quiet one"])
    assert short.shape[1] < long_.shape[1]
    [silence] = references(extractor, REQUESTS["silence"])
    assert np.allclose(silence, -1.5)  # log10(1e-10) = -10, then (x + 4) / 4
