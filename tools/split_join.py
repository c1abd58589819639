"""split and join: between llama.cpp's `clef` GGUFs and a backbone GGUF + the release's safetensors head."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bridge.gguf.clef_split import JoinResult, SplitResult, join, split
from ..head.errors import Category, ClefError
from ..head.schema import QUESTION_TYPES
from .checks import PairResult, pair_files


class TemperatureError(ClefError):
    category = Category.USAGE
    error_type = "temperature_error"


@dataclass(frozen=True)
class SplitReport:
    split: SplitResult
    pair: PairResult  # the pairing record of the written backbone and head

    @property
    def ok(self) -> bool:
        return self.pair.ok

    def to_dict(self) -> dict[str, Any]:
        s = self.split
        return {"backbone": str(s.backbone), "head": str(s.head), "config": str(s.config), "head_dtype": s.head_dtype,
                "temperatures": s.temperatures, "bytes": s.bytes, "seconds": round(s.seconds, 2),
                "pair": self.pair.to_dict()}


def split_model(clef: Path, out_dir: Path, head_dtype: str | None, overwrite: bool) -> SplitReport:
    """Split, then pair the written files (so the server checks them like a release download)."""
    result = split(clef, out_dir, head_dtype, overwrite)
    return SplitReport(result, pair_files(result.backbone, result.head, None))


def parse_temperatures(text: str | None, calibration: Path | None) -> dict[str, float]:
    """--temperature ('0.7' or 'choice=0.7,score.3_5=0.9') merged over --from-calibration's temperatures."""
    out: dict[str, float] = {}
    if calibration is not None:
        try:
            out.update(json.loads(calibration.read_text(encoding="utf-8"))["temperatures"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TemperatureError(f"{calibration}: not the JSON `clef-bridge calibrate --json` prints ({exc})",
                                   fix="clef-bridge calibrate --data D --models M --model N --json > cal.json") \
                from None
    for item in filter(None, (text or "").split(",")):
        key, sep, value = item.rpartition("=")
        keys = [key.strip()] if sep else list(QUESTION_TYPES)
        try:
            t = float(value)
        except ValueError:
            raise TemperatureError(f"--temperature {item!r}: not a number", fix="write e.g. 0.7 or choice=0.7") \
                from None
        out.update(dict.fromkeys(keys, t))
    bad = {k: t for k, t in out.items() if not (isinstance(t, (int, float)) and 0.01 <= t <= 100)}
    if bad:
        raise TemperatureError(f"temperatures must lie between 0.01 and 100, got {bad}")
    return {k: float(t) for k, t in out.items()}


def join_model(backbone: Path, head: Path, out: Path, head_dtype: str | None, temperature: str | None,
               calibration: Path | None, overwrite: bool) -> JoinResult:
    return join(backbone, head, out, head_dtype, parse_temperatures(temperature, calibration), overwrite)
