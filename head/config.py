"""The joint schema head's hyperparameters, as in joint_head_config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from .errors import HeadConfigError

CONFIG_NAME = "joint_head_config.json"


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    width: int
    routing_layers: int
    layers: int
    heads: int
    feedforward: int
    dropout: float = 0.0

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


# Clef-flash's released joint_head_config.json (Clef's differs in hidden_size only)
CLEF_FLASH_HEAD = HeadConfig(hidden_size=4096, width=1024, routing_layers=2, layers=4, heads=16, feedforward=4096)


def parse_config(raw: object, source: str = CONFIG_NAME) -> HeadConfig:
    """Validate a decoded config object; every problem is named in one error."""
    if not isinstance(raw, dict):
        raise HeadConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    known = {f.name for f in fields(HeadConfig)}
    problems = [f"unknown key {k!r}" for k in raw if k not in known]
    for f in fields(HeadConfig):
        if f.name not in raw:
            if f.name != "dropout":
                problems.append(f"missing key {f.name!r}")
            continue
        value = raw[f.name]
        if f.name == "dropout":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                problems.append("'dropout' must be a number")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{f.name!r} must be a positive integer, got {value!r}")
    if not problems and raw["width"] % raw["heads"]:
        problems.append(f"'width' ({raw['width']}) must be divisible by 'heads' ({raw['heads']})")
    if problems:
        raise HeadConfigError(f"{source}: " + "; ".join(problems))
    return HeadConfig(**raw)


def config_path_for(head_path: str | Path) -> Path:
    """The config lies beside the weights, as in a Clef release folder."""
    return Path(head_path).with_name(CONFIG_NAME)


def load_config(path: str | Path) -> HeadConfig:
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HeadConfigError(
            f"{path}: not found; the head's config ships beside joint_head.safetensors in the "
            "Clef release repository (Cloudflare/clef-flash or Cloudflare/clef)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeadConfigError(f"{path}: cannot read: {exc}") from None
    return parse_config(raw, str(path))
