"""`python -m benchmarks fuzz`'s parts (the command itself runs for minutes against a live server: docs/security.md
holds its figures): its mutations are seeded and change the bytes, and its tally finds 5xx and the slowest refusal."""

from __future__ import annotations

import random

import pytest

from benchmarks.fuzz import Tally, mutate

pytestmark = pytest.mark.unit


def test_mutations_are_seeded_and_edit_the_bytes():
    data = bytes(range(256)) * 4
    first = [mutate(data, random.Random(7)) for _ in range(3)]
    assert first == [mutate(data, random.Random(7)) for _ in range(3)]
    assert sum(m != data for m in (mutate(data, random.Random(seed)) for seed in range(50))) >= 45


def test_the_tally_keeps_the_5xx_and_the_slowest_refusal():
    tally = Tally()
    for status, ms, what in ((200, 900.0, "an answer"), (422, 12.0, "a"), (413, 40.0, "b"), (503, 1.0, "c")):
        tally.add(status, ms, what)
    assert tally.slowest_refusal == (40.0, "b") and tally.server_errors == ["503 c"]
    assert tally.statuses == {200: 1, 422: 1, 413: 1, 503: 1}
