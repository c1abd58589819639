"""models.toml: the registry of served models, parsed strictly into frozen dataclasses."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from ..head.errors import ClefError
from ..head.schema import QUESTION_TYPES, Limits

LATEST = "jev-latest"


class RegistryError(ClefError):
    """models.toml is missing, malformed, or names something that does not exist."""

    error_type = "registry_error"


class UnknownModel(ClefError):
    """A request named a model this server does not serve."""

    error_type = "model_not_found"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    gguf: Path
    head: Path  # joint_head_config.json lies beside it
    n_ctx: int = 16384  # llama.cpp context: the token budget of one batched decode
    n_gpu_layers: int | str = -1  # -1 = all layers on the GPU (when llama.cpp has one); "auto" = the fit plan
    n_ubatch: int = 512
    n_seq_max: int = 8  # requests per batched decode
    n_threads: int = 0  # 0 = every core
    max_length: int = 16384  # longest prompt accepted, in tokens
    truncate_state: bool = False
    temperature: dict[str, float] = field(default_factory=lambda: dict.fromkeys(QUESTION_TYPES, 1.0))
    confidence: str = "reference"
    question_ids: str = "prompt"
    parse_special_in_user_text: bool = False
    head_device: str = "cpu"
    aliases: tuple[str, ...] = ()
    description: str = ""
    release_date: str = ""
    gguf_sha256: str = ""  # optional pins, checked at load
    head_sha256: str = ""
    pair: Path | None = None  # pairing record; default <gguf stem>.pair.json beside the GGUF when present
    builtin: str = ""  # "demo": the embedded demo model, built into the cache on first use

    def ensure_files(self) -> None:
        """Build the files of a built-in model if they are not there yet."""
        if self.builtin == "demo":
            from .demo import make_demo

            make_demo(self.gguf.parent)


@dataclass(frozen=True)
class ServerSpec:
    api_keys_file: Path | None = None  # one key per line; none = auth off
    max_body_bytes: int = 4 * 1024 * 1024  # after decompression too
    max_queue: int = 64  # requests waiting per model; beyond it, 429
    request_timeout_s: float = 60.0  # per request, queue included; beyond it, 503
    retry_after_s: int = 1  # the Retry-After sent with 429 and 503
    body_timeout_s: float = 30.0  # a client must deliver its body within this; slower ones get 408
    cache_size: int = 0  # answers kept for exact repeats (identical in-flight requests always share one run)
    max_questions: int = 64
    max_options: int = 255
    max_levels: int = 10
    max_state_bytes: int = 512 * 1024
    max_json_depth: int = 64

    @property
    def limits(self) -> Limits:
        return Limits(self.max_questions, self.max_options, self.max_levels, self.max_state_bytes,
                      self.max_json_depth)


@dataclass(frozen=True)
class Registry:
    path: Path
    default: str
    models: dict[str, ModelSpec]
    server: ServerSpec = ServerSpec()

    def resolve(self, name: str) -> ModelSpec:
        """The model a request's `model` field names: its name, an alias, or jev-latest (the default)."""
        if name == LATEST:
            return self.models[self.default]
        for spec in self.models.values():
            if name == spec.name or name in spec.aliases:
                return spec
        raise UnknownModel(f"model {name!r} is not served here; served: {', '.join(self.served_names())}")

    def served_names(self) -> list[str]:
        names = [LATEST]
        for spec in self.models.values():
            names += [spec.name, *spec.aliases]
        return names


_TYPES: dict[str, Any] = {
    "gguf": str, "head": str, "n_ctx": int, "n_gpu_layers": (int, str), "n_ubatch": int, "n_seq_max": int,
    "n_threads": int, "max_length": int, "truncate_state": bool, "temperature": (int, float, dict),
    "confidence": str, "question_ids": str, "parse_special_in_user_text": bool, "head_device": str,
    "aliases": list, "description": str, "release_date": str, "gguf_sha256": str, "head_sha256": str, "pair": str,
    "builtin": str,
}
_CHOICES = {"confidence": ("reference", "jev"), "question_ids": ("prompt", "blind"), "head_device": ("cpu", "cuda"),
            "builtin": ("demo",)}
_POSITIVE = ("n_ctx", "n_ubatch", "n_seq_max", "max_length")


def _temperature(value: Any, where: str) -> dict[str, float]:
    if not isinstance(value, dict):
        value = dict.fromkeys(QUESTION_TYPES, value)
    unknown = sorted(set(value) - set(QUESTION_TYPES))
    if unknown:
        raise RegistryError(f"{where}.temperature: unknown question type(s) {unknown}; use noul, choice, score")
    out = dict.fromkeys(QUESTION_TYPES, 1.0)
    for key, t in value.items():
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.01 <= t <= 100:
            raise RegistryError(f"{where}.temperature.{key}: must be a number between 0.01 and 100, got {t!r}")
        out[key] = float(t)
    return out


def _absolute(path: Path) -> Path:
    # abspath, not resolve(): a Hugging Face cache file is a symlink into blobs/, and its
    # joint_head_config.json lies beside the link, not beside the blob
    return Path(os.path.abspath(path))


def _is_date(text: str) -> bool:
    try:
        return date.fromisoformat(text).isoformat() == text
    except ValueError:
        return False


def _model(name: str, raw: Any, base: Path, where: str) -> ModelSpec:
    if not isinstance(raw, dict):
        raise RegistryError(f"{where}: must be a table")
    unknown = sorted(set(raw) - set(_TYPES))
    if unknown:
        raise RegistryError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(_TYPES)}")
    if "builtin" in raw:
        if "gguf" in raw or "head" in raw:
            raise RegistryError(f"{where}: a builtin model takes no gguf or head")
        raw = {**demo_paths(), "description": _demo_description(), **raw}
    for key in ("gguf", "head"):
        if key not in raw:
            raise RegistryError(f"{where}: missing required key {key!r}")
    for key, value in raw.items():
        want = _TYPES[key]
        if isinstance(value, bool) and want is int or not isinstance(value, want):
            raise RegistryError(f"{where}.{key}: wrong type {type(value).__name__}")
        if key == "n_gpu_layers" and isinstance(value, str) and value != "auto":
            raise RegistryError(f"{where}.n_gpu_layers: a number or \"auto\", got {value!r}")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise RegistryError(f"{where}.{key}: must be one of {list(_CHOICES[key])}, got {value!r}")
        if key in _POSITIVE and value < 1:
            raise RegistryError(f"{where}.{key}: must be positive, got {value}")
    values = dict(raw)
    values["gguf"] = _absolute(base / raw["gguf"])
    values["head"] = _absolute(base / raw["head"])
    if "pair" in raw:
        values["pair"] = _absolute(base / raw["pair"])
    for key in ("gguf_sha256", "head_sha256"):
        if key in raw and not re.fullmatch(r"[0-9a-fA-F]{64}", raw[key]):
            raise RegistryError(f"{where}.{key}: must be 64 hex digits")
    if "temperature" in raw:
        values["temperature"] = _temperature(raw["temperature"], where)
    if "aliases" in raw:
        if not all(isinstance(a, str) and a for a in raw["aliases"]):
            raise RegistryError(f"{where}.aliases: must be a list of non-empty strings")
        values["aliases"] = tuple(raw["aliases"])
    if "release_date" in raw and not _is_date(raw["release_date"]):
        raise RegistryError(f"{where}.release_date: must be YYYY-MM-DD, got {raw['release_date']!r}")
    spec = ModelSpec(name=name, **values)
    if spec.max_length > spec.n_ctx:
        raise RegistryError(f"{where}: max_length ({spec.max_length}) exceeds n_ctx ({spec.n_ctx}); a prompt that "
                            "long could not be decoded: raise n_ctx or lower max_length")
    return spec


_SERVER_TYPES: dict[str, Any] = {"api_keys_file": str, "max_body_bytes": int, "max_queue": int,
                                 "request_timeout_s": (int, float), "retry_after_s": int,
                                 "body_timeout_s": (int, float), "cache_size": int, "max_questions": int,
                                 "max_options": int, "max_levels": int, "max_state_bytes": int,
                                 "max_json_depth": int}


def _server(raw: Any, base: Path, where: str) -> ServerSpec:
    if not isinstance(raw, dict):
        raise RegistryError(f"{where}: must be a table")
    unknown = sorted(set(raw) - set(_SERVER_TYPES))
    if unknown:
        raise RegistryError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(_SERVER_TYPES)}")
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, _SERVER_TYPES[key]):
            raise RegistryError(f"{where}.{key}: wrong type {type(value).__name__}")
        if key != "api_keys_file" and (value < 0 or value == 0 and key != "cache_size"):  # cache_size 0: no cache
            raise RegistryError(f"{where}.{key}: must be positive, got {value}")
    values = dict(raw)
    if "api_keys_file" in raw:
        values["api_keys_file"] = _absolute(base / raw["api_keys_file"])
    return ServerSpec(**values)


def demo_paths() -> dict[str, str]:
    from .demo import DEMO_VERSION, demo_files
    from .paths import cache_dir

    files = demo_files(cache_dir() / f"demo-v{DEMO_VERSION}")
    return {"gguf": str(files.gguf), "head": str(files.head), "n_ctx": 8192, "max_length": 8192}


def _demo_description() -> str:
    from .demo import DEMO_DESCRIPTION

    return DEMO_DESCRIPTION


def demo_registry(path: Path) -> Registry:
    """What `serve` uses when there is no models.toml: the built-in demo alone."""
    return parse_registry({"default": "demo", "models": {"demo": {"builtin": "demo"}}}, path)


def parse_registry(raw: dict[str, Any], path: Path) -> Registry:
    unknown = sorted(set(raw) - {"default", "models", "server"})
    if unknown:
        raise RegistryError(f"{path}: unknown top-level key(s) {unknown}; known: default, models, server")
    models_raw = raw.get("models")
    if not isinstance(models_raw, dict) or not models_raw:
        raise RegistryError(f"{path}: no models; add a [models.NAME] table with gguf and head")
    models = {name: _model(name, spec, path.parent, f"{path}: models.{name}") for name, spec in models_raw.items()}
    default = raw.get("default", next(iter(models)))
    if default not in models:
        raise RegistryError(f"{path}: default = {default!r} is not one of the models {sorted(models)}")
    seen: dict[str, str] = {}
    for spec in models.values():
        for n in (spec.name, *spec.aliases):
            if n in seen or n == LATEST:
                raise RegistryError(f"{path}: the name {n!r} is used twice (models.{seen.get(n, spec.name)})")
            seen[n] = spec.name
    server = _server(raw.get("server", {}), path.parent, f"{path}: server")
    return Registry(path=path, default=default, models=models, server=server)


def load_registry(path: str | Path) -> Registry:
    path = _absolute(Path(path))
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RegistryError(f"{path}: not found; pass --models PATH or create models.toml") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RegistryError(f"{path}: cannot parse: {exc}") from None
    return parse_registry(raw, path)
