"""bridge/host/progress.py: the one-line progress bar, drawn only when enabled and at most every 0.2 s."""

from __future__ import annotations

import pytest
from clef_bridge.bridge.host import progress
from clef_bridge.bridge.host.progress import Progress

pytestmark = pytest.mark.unit


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    return now


def test_a_disabled_bar_writes_nothing(capsys, clock):
    bar = Progress("hashing", 10, enabled=False)
    bar.update(5)
    bar.update(5)
    bar.close()
    assert capsys.readouterr().err == "" and bar.done == 10


def test_the_bar_shows_the_fraction_and_the_size_in_gib(capsys, clock):
    bar = Progress("hashing", 2**31, enabled=True)
    bar.update(2**30)
    err = capsys.readouterr().err
    assert err == f"\rhashing [{'#' * 15:<30}]  50.0% of 2.00 GiB"


def test_other_units_are_counted_not_sized(capsys, clock):
    bar = Progress("eval", 4, enabled=True, unit="examples")
    bar.update(4)
    bar.close()
    assert capsys.readouterr().err == f"\reval [{'#' * 30}] 100.0% of 4 examples\n"


def test_updates_within_a_fifth_of_a_second_draw_once_but_the_last_always_draws(capsys, clock):
    bar = Progress("w", 100, enabled=True, unit="steps")
    bar.update(10)
    clock[0] += 0.1
    bar.update(10)  # too soon: not drawn
    assert capsys.readouterr().err.count("\r") == 1
    clock[0] += 0.3
    bar.update(10)
    assert "30.0%" in capsys.readouterr().err
    clock[0] += 0.01
    bar.update(70)  # done: drawn however soon
    assert "100.0%" in capsys.readouterr().err


def test_a_zero_total_and_an_overshoot_stay_at_100_percent(capsys, clock):
    bar = Progress("empty", 0, enabled=True, unit="files")
    bar.update(3)
    assert capsys.readouterr().err == f"\rempty [{'#' * 30}] 100.0% of 1 files"


def test_default_follows_whether_stderr_is_a_terminal(monkeypatch):
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: False, raising=False)
    assert Progress("x", 1).enabled is False
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: True, raising=False)
    assert Progress("x", 1).enabled is True
