"""Where clef-bridge keeps files it makes for itself (hash cache, the demo model)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$CLEF_BRIDGE_CACHE, else $XDG_CACHE_HOME/clef-bridge, else ~/.cache/clef-bridge."""
    root = os.environ.get("CLEF_BRIDGE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "clef-bridge")
    return Path(root)
