"""A one-line progress bar on stderr, for long work at every layer (hashing, writing GGUFs, eval)."""

from __future__ import annotations

import sys
import time


class Progress:
    """A one-line progress bar on stderr for long work (silent when stderr is not a terminal)."""

    def __init__(self, label: str, total: int, enabled: bool | None = None, unit: str = "bytes"):
        self.label, self.total, self.done, self.unit = label, max(total, 1), 0, unit
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._last = 0.0

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.2 or self.done >= self.total):
            self._last = now
            frac = min(self.done / self.total, 1.0)
            size = f"{self.total / 2**30:.2f} GiB" if self.unit == "bytes" else f"{self.total} {self.unit}"
            sys.stderr.write(f"\r{self.label} [{'#' * int(frac * 30):<30}] {frac * 100:5.1f}% of {size}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
