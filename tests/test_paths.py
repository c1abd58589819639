"""bridge/host/paths.py: where clef-bridge keeps its own files, by the environment's precedence."""

from __future__ import annotations

import pytest
from clef_bridge.bridge.host.paths import cache_dir

pytestmark = pytest.mark.unit


def test_clef_bridge_cache_wins_over_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("CLEF_BRIDGE_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "mine"


def test_xdg_cache_home_gets_a_clef_bridge_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("CLEF_BRIDGE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "clef-bridge"


def test_empty_variables_count_as_unset(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLEF_BRIDGE_CACHE", "")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert cache_dir() == tmp_path / ".cache" / "clef-bridge"
