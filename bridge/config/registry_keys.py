"""models.toml's keys as data: each key names the dataclass field it sets, its type and its check.

The registry (registry.py) validates a file against these tables; problems are collected, not raised,
so one error lists every problem of the file with its key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from datetime import date
from typing import Any, Callable

from ...head.answer import BUCKETS
from ...head.errors import did_you_mean
from ...head.schema import QUESTION_TYPES, Limits
from ...head.weights import dtype_name
from ..catalogue.dtypes import HEAD_DTYPES, KV_CACHE_DTYPES
from ..catalogue.releases import REAL_RELEASES
from ..media.decoders import MIN_MEMORY_MB
from .registry_names import name_problem, shown


class _Bad(Exception):
    """One problem with one key's value (collected, then reported together)."""


def _positive(value: Any) -> Any:
    if value < 1:
        raise _Bad(f"must be positive, got {value}")
    return value


def _non_negative(value: Any) -> Any:
    if value < 0:
        raise _Bad(f"must be 0 or more, got {value}")
    return value


def _one_of(*choices: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value not in choices:
            raise _Bad(f"must be one of {list(choices)}, got {value!r}")
        return value
    return check


def _dtype(*choices: str) -> Callable[[Any], Any]:
    """A dtype in the one vocabulary (f32, f16, ...), earlier spellings (float16) read as their names."""
    def check(value: Any) -> Any:
        if dtype_name(value) not in choices:
            raise _Bad(f"must be one of {list(choices)}, got {value!r}")
        return dtype_name(value)
    return check


def _above_zero(value: Any) -> Any:
    if value <= 0:
        raise _Bad(f"must be above 0, got {value}")
    return value


def _decoder_memory(value: Any) -> Any:
    if value < MIN_MEMORY_MB:
        raise _Bad(f"must be at least {MIN_MEMORY_MB} (MB): a decoder process maps about 260 MB before it decodes "
                   f"anything, got {value}")
    return value


def _gpus(value: Any) -> Any:
    if value != "auto" and (isinstance(value, str) or value < 0):
        raise _Bad(f"a number of GPUs (0 or more) or \"auto\", got {value!r}")
    return value


def _gpu_layers(value: Any) -> Any:
    if isinstance(value, str) and value != "auto":
        raise _Bad(f"a number or \"auto\", got {value!r}")
    return value


def _cpu_moe(value: Any) -> Any:
    if (isinstance(value, str) and value != "auto") or (isinstance(value, int) and value < 0):
        raise _Bad(f"a number of blocks (0 or more) or \"auto\", got {value!r}")
    return value


def _sha256(value: str) -> str:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise _Bad("must be 64 hex digits")
    return value.lower()


def _date(value: str) -> str:
    try:
        if date.fromisoformat(value).isoformat() == value:
            return value
    except ValueError:
        pass
    raise _Bad(f"must be YYYY-MM-DD, got {value!r}")


def _aliases(value: list) -> tuple[str, ...]:
    if not all(isinstance(a, str) and a for a in value):
        raise _Bad("must be a list of non-empty strings")
    bad = next(((i, name_problem(a)) for i, a in enumerate(value) if name_problem(a)), None)
    if bad:
        raise _Bad(f"alias {bad[0]} ({shown(value[bad[0]])}): {bad[1]}")
    return tuple(value)


def _shadows(value: list) -> tuple[str, ...]:
    if not all(isinstance(a, str) and a for a in value) or len(set(value)) != len(value):
        raise _Bad("must be a list of distinct model names")
    return tuple(value)


TEMPERATURE_KEYS = tuple(QUESTION_TYPES) + tuple(f"{t}.{b}" for t in QUESTION_TYPES for b, _ in BUCKETS)


def _temperature(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        value = dict.fromkeys(QUESTION_TYPES, value)
    unknown = sorted(set(value) - set(TEMPERATURE_KEYS))
    if unknown:
        raise _Bad(f"unknown question type(s) {unknown}; use {', '.join(QUESTION_TYPES)} (or TYPE.BUCKET with a "
                   f"bucket of {', '.join(b for b, _ in BUCKETS)} options, as llama.cpp's clef GGUFs do)")
    out = {}
    for key, t in value.items():
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.01 <= t <= 100:
            raise _Bad(f"{key} must be a number between 0.01 and 100, got {t!r}")
        out[key] = float(t)
    return out


@dataclass(frozen=True)
class Key:
    """One models.toml key: the dataclass field it sets ('' group = ModelSpec itself), its type, a check."""

    group: str
    field: str
    types: Any
    check: Callable[[Any], Any] | None = None


MODEL_KEYS: dict[str, Key] = {
    "gguf": Key("", "gguf", str), "head": Key("", "head_path", str), "pair": Key("", "pair", str),
    "builtin": Key("", "builtin", str, _one_of(*REAL_RELEASES)),
    "head_device": Key("", "head_device", str, _one_of("auto", "cpu", "cuda")),
    "head_dtype": Key("", "head_dtype", str, _dtype(*HEAD_DTYPES)),
    "aliases": Key("", "aliases", list, _aliases), "description": Key("", "description", str),
    "shadow": Key("", "shadow", list, _shadows),
    "mmproj": Key("", "mmproj", str),
    "lora": Key("", "lora", str), "lora_scale": Key("", "lora_scale", (int, float), lambda v: float(_non_negative(v))),
    "release_date": Key("", "release_date", str, _date),
    "gguf_sha256": Key("", "gguf_sha256", str, _sha256), "head_sha256": Key("", "head_sha256", str, _sha256),
    "n_ctx": Key("backbone", "n_ctx", int, _positive),
    "n_gpu_layers": Key("backbone", "n_gpu_layers", (int, str), _gpu_layers),
    "n_cpu_moe": Key("backbone", "n_cpu_moe", (int, str), _cpu_moe),
    "n_ubatch": Key("backbone", "n_ubatch", int, _positive),
    "n_seq_max": Key("backbone", "n_seq_max", int, _positive),
    "n_threads": Key("backbone", "n_threads", int, _non_negative),
    "kv_type": Key("backbone", "kv_type", str, _one_of(*KV_CACHE_DTYPES)),
    "max_length": Key("encode", "max_length", int, _positive),
    "truncate_state": Key("encode", "truncate_state", bool),
    "parse_special_in_user_text": Key("encode", "parse_special_in_user_text", bool),
    "question_ids": Key("encode", "blind_ids", str, lambda v: _one_of("prompt", "blind")(v) == "blind"),
    "prefix_cache_mb": Key("prefix", "max_mb", (int, float), _non_negative),
    "prefix_cache_every": Key("prefix", "every", int, _positive),
    "prefix_cache_sequences": Key("prefix", "sequences", int, _positive),
    "prefix_cache_cells": Key("prefix", "extra_cells", int, _non_negative),
    "temperature": Key("answer", "temperature", (int, float, dict), _temperature),
    "confidence": Key("answer", "confidence", str, _one_of("reference", "jev")),
}

SERVER_KEYS: dict[str, Key] = {
    "api_keys_file": Key("", "api_keys_file", str),
    "max_body_bytes": Key("", "max_body_bytes", int, _positive),
    "max_queue": Key("", "max_queue", int, _positive),
    "request_timeout_s": Key("", "request_timeout_s", (int, float), _positive),
    "retry_after_s": Key("", "retry_after_s", int, _positive),
    "body_timeout_s": Key("", "body_timeout_s", (int, float), _positive),
    "write_timeout_s": Key("", "write_timeout_s", (int, float), _positive),
    "cache_size": Key("", "cache_size", int, _non_negative),
    "max_queue_per_key": Key("", "max_queue_per_key", int, _non_negative),
    "share_caches_across_keys": Key("", "share_caches_across_keys", bool),
    **{f.name: Key("limits", f.name, int, _positive) for f in fields(Limits)},
    "max_images": Key("images", "max_images", int, _positive),
    "max_image_bytes": Key("images", "max_bytes", int, _positive),
    "max_image_total_bytes": Key("images", "max_total_bytes", int, _positive),
    "max_image_pixels": Key("images", "max_pixels", int, _positive),
    "max_audio_clips": Key("audio", "max_clips", int, _positive),
    "max_audio_bytes": Key("audio", "max_bytes", int, _positive),
    "max_audio_seconds": Key("audio", "max_seconds", (int, float), _above_zero),
    "decode_workers": Key("decoders", "workers", int, _positive),
    "decode_memory_mb": Key("decoders", "memory_mb", int, _decoder_memory),
    "decode_timeout_s": Key("decoders", "seconds", (int, float), _above_zero),
    "decode_video_timeout_s": Key("decoders", "video_seconds", (int, float), _above_zero),
    "max_videos": Key("videos", "max_videos", int, _positive),
    "max_video_bytes": Key("videos", "max_bytes", int, _positive),
    "max_video_seconds": Key("videos", "max_seconds", (int, float), _above_zero),
    "max_media_bytes": Key("videos", "max_media_bytes", int, _positive),
    "decision_log": Key("decision_log", "path", str),
    "decision_log_max_mb": Key("decision_log", "max_mb", (int, float), _above_zero),
    "decision_log_keep": Key("decision_log", "keep", int, _non_negative),
    "decision_log_states": Key("decision_log", "states", bool),
}

RAY_KEYS: dict[str, Key] = {
    "min_replicas": Key("", "min_replicas", int, _positive), "max_replicas": Key("", "max_replicas", int, _positive),
    "num_gpus": Key("", "num_gpus", (int, float, str), _gpus),
    "num_cpus": Key("", "num_cpus", (int, float), _above_zero),
    "target_ongoing_requests": Key("", "target_ongoing_requests", int, _non_negative),
    "max_ongoing_requests": Key("", "max_ongoing_requests", int, _non_negative),
    **{k: Key("", k, (int, float), _non_negative) for k in ("upscale_delay_s", "downscale_delay_s")},
    **{k: Key("", k, (int, float), _above_zero) for k in ("look_back_period_s", "health_check_period_s")},
}


def _typed(value: Any, types: Any) -> bool:
    wanted = types if isinstance(types, tuple) else (types,)
    return isinstance(value, wanted) and not (isinstance(value, bool) and bool not in wanted)


def values_by_group(raw: dict[str, Any], keys: dict[str, Key], where: str, problems: list[str]) -> dict[str, dict]:
    """Checked values grouped by the dataclass they go to; problems appended, not raised."""
    groups: dict[str, dict] = {}
    for name, value in raw.items():
        key = keys.get(name)
        if key is None:
            problems.append(f"{where}.{name}: unknown key; {did_you_mean(name, keys)}known keys: "
                            f"{', '.join(sorted(keys))}")
            continue
        if not _typed(value, key.types):
            problems.append(f"{where}.{name}: wrong type {type(value).__name__}")
            continue
        try:
            groups.setdefault(key.group, {})[key.field] = key.check(value) if key.check else value
        except _Bad as exc:
            problems.append(f"{where}.{name}: {exc}")
    return groups
