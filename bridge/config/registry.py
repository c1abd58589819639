"""models.toml: the registry of served models, parsed strictly into frozen dataclasses.

Each models.toml key maps onto one field of an options dataclass (BackboneOptions, EncodeOptions,
AnswerOptions, Limits, ...), so every default is written once, in that dataclass. Validation
collects every problem of the file and raises one RegistryError listing them with their keys.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from ...head.answer import AnswerOptions
from ...head.encoder import EncodeOptions
from ...head.errors import Category, ClefError, Problem, RequestInvalid, did_you_mean
from ...head.media import AUDIO, IMAGE, VIDEO
from ...head.schema import Limits
from ..catalogue.releases import CLOUDFLARE_NAMES, NAMED_BY_ARCHITECTURE
from ..llama.options import BackboneOptions, PrefixCacheOptions
from ..media.audio import AudioLimits
from ..media.decoders import DecoderLimits, memory_for
from ..media.images import ImageLimits
from ..media.video import VideoLimits
from .registry_keys import MODEL_KEYS, RAY_KEYS, SERVER_KEYS, values_by_group
from .registry_names import MAX_NAME_CHARS, MAX_REQUESTED_CHARS, name_problem, shown

LATEST = "jev-latest"
DEFAULT_NAMES = (LATEST, "jev-preview")  # the names that mean the registry's default model


class RegistryError(ClefError):
    """models.toml is missing, malformed, or names something that does not exist."""

    category = Category.CONFIG
    error_type = "registry_error"


class UnknownModel(ClefError):
    """A request named a model this server does not serve."""

    category = Category.NOT_FOUND
    error_type = "model_not_found"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    gguf: Path
    head_path: Path | None = None  # models.toml `head`; None: embedded in a clef GGUF, or the one beside the GGUF
    backbone: BackboneOptions = BackboneOptions()
    encode: EncodeOptions = EncodeOptions()
    answer: AnswerOptions = AnswerOptions()
    head_device: str = "auto"  # "cuda": the head runs on CuPy; "auto": there where CuPy finds a CUDA device
    head_dtype: str = "f32"  # "f16": the head's matrices stored in half the GPU memory (head_device cuda)
    aliases: tuple[str, ...] = ()
    description: str = ""
    release_date: str = ""
    gguf_sha256: str = ""  # optional pins, checked at load
    head_sha256: str = ""
    pair: Path | None = None  # pairing record; default <gguf stem>.pair.json beside the GGUF when present
    builtin: str = ""  # "demo" or "demo-omni": an embedded demo model, built into the cache on first use
    mmproj: Path | None = None  # vision projector GGUF; None: mmproj*.gguf beside the GGUF, if there is one
    # a LoRA adapter applied at run time over the GGUF: a PEFT adapter folder (clef-finetune's adapter/, or its
    # checkpoint folder) or a GGUF LoRA file; lora_scale multiplies it (1.0: as trained, PEFT's alpha / r included)
    lora: Path | None = None
    lora_scale: float = 1.0
    # served models that also score each answered request, after its answer is sent and at the lowest priority,
    # for the decision log and /metrics (fine-tunes compared on live traffic before a switch)
    shadow: tuple[str, ...] = ()
    # the models.toml keys the entry sets: where a default depends on the model (Clef-omni's context length, see
    # bridge/model/loading.py), only a key left unset takes it
    keys: frozenset[str] = frozenset()


DECISION_LOG_NAME = "decisions.jsonl"  # the file a decision_log folder holds


@dataclass(frozen=True)
class DecisionLogSpec:
    """[server] decision_log*: the opt-in log of answered decisions, a JSON line each (server/decision_log.py)."""

    path: Path | None = None  # the file (a folder: decisions.jsonl in it); None: no log
    max_mb: float = 64.0  # the file is rotated (path.1, path.2, ...) before a line would take it beyond this
    keep: int = 5  # rotated files kept; 0: the file starts over
    states: bool = False  # true: each line holds the state's text too (its sha256 and size always)


@dataclass(frozen=True)
class ServerSpec:
    api_keys_file: Path | None = None  # one key per line; none = auth off
    max_body_bytes: int = 4 * 1024 * 1024  # after decompression too
    max_queue: int = 64  # requests waiting per model; beyond it, 429
    request_timeout_s: float = 60.0  # per request, queue included; beyond it, 503
    retry_after_s: int = 1  # the Retry-After sent with 429 and 503
    body_timeout_s: float = 30.0  # a client must deliver its body within this; slower ones get 408
    write_timeout_s: float = 30.0  # a client must take its answer within this; one that does not read is cut off
    cache_size: int = 0  # answers kept for exact repeats (identical in-flight requests always share one run)
    # requests one key may have queued per model; 0: half of max_queue with api_keys_file (other keys keep the rest),
    # all of it without (one tenant)
    max_queue_per_key: int = 0
    # true: the prefix cache, the answer cache and in-flight coalescing are shared between API keys (one owner's
    # keys); false: each key's are its own, so no key learns from them what another sent
    share_caches_across_keys: bool = False
    limits: Limits = Limits()
    images: ImageLimits = ImageLimits()
    audio: AudioLimits = AudioLimits()
    decoders: DecoderLimits = DecoderLimits()  # the processes that decode media (bridge/media/decoders.py)
    videos: VideoLimits = VideoLimits()
    decision_log: DecisionLogSpec = DecisionLogSpec()

    @property
    def decoder_limits(self) -> DecoderLimits:
        """The decoder processes' limits, decode_memory_mb derived from the video limits where it is not set."""
        return replace(self.decoders, memory_mb=self.decoders.memory_mb or memory_for(self.videos))

    @property
    def tenant_queue(self) -> int:
        """The most requests one key (one tenant) may have queued per model."""
        return self.max_queue_per_key or (max(1, self.max_queue // 2) if self.api_keys_file else self.max_queue)

    @property
    def media_limits(self) -> dict[str, Any]:
        """Each medium's limits by its kind's name: what its decoding and the body's size cap read."""
        return {IMAGE.name: self.images, AUDIO.name: self.audio, VIDEO.name: self.videos}


@dataclass(frozen=True)
class RaySpec:
    """[ray]: the replicas of `serve --ray` (bridge/scale/ray_plan.py); 0 derives a value, as n_threads = 0 does."""

    min_replicas: int = 1
    max_replicas: int = 1  # above min_replicas: Serve autoscales on ongoing requests
    num_gpus: float | str = "auto"  # per replica; "auto": 1 where the cluster has GPUs, else 0
    num_cpus: float = 1.0  # per replica; a CPU replica's llama.cpp runs this many threads unless n_threads is set
    target_ongoing_requests: int = 0  # 0: the default model's n_seq_max, one full batch per replica
    max_ongoing_requests: int = 0  # 0: twice the target, a batch decoding while the next one forms
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    look_back_period_s: float = 30.0
    health_check_period_s: float = 10.0


@dataclass(frozen=True)
class Registry:
    path: Path
    default: str
    models: dict[str, ModelSpec]
    server: ServerSpec = ServerSpec()
    ray: RaySpec = RaySpec()


# --- names -------------------------------------------------------------------------------------

def name_table(registry: Registry, hidden_sizes: dict[str, int], architectures: dict[str, str] | None = None
               ) -> dict[str, str]:
    """Every name a request may use -> the model it means.

    Explicit names and aliases first; then jev-latest / jev-preview for the default model; then
    Cloudflare's names (clef-flash for hidden 4096, clef for 5120; the demo answers to both) for the
    default model when it has that width, else the first model that does; clef-omni for the default model
    when its backbone is Qwen3-Omni's (architectures: each model's GGUF architecture), else the first that is.
    """
    architectures = architectures or {}
    table = {n: spec.name for spec in registry.models.values() for n in (spec.name, *spec.aliases)}
    for n in DEFAULT_NAMES:
        table.setdefault(n, registry.default)
    order = [registry.default] + [n for n in registry.models if n != registry.default]
    by_arch = [n for n in order if architectures.get(n) in NAMED_BY_ARCHITECTURE]
    for hidden, cf_name in CLOUDFLARE_NAMES.items():
        match = next((n for n in order if n not in by_arch and (hidden_sizes.get(n) == hidden
                                                                 or registry.models[n].builtin == "demo")), None)
        if match is not None:
            table.setdefault(cf_name, match)
    for n in by_arch:
        table.setdefault(NAMED_BY_ARCHITECTURE[architectures[n]], n)
    return table


def resolve(table: dict[str, str], name: str, fits: Callable[[str], bool] = lambda model: True,
            at: tuple[str | int, ...] = ("body", "model")) -> str:
    """The model a request's `model` field names; fits: whether a served model could answer the request (takes its
    media), so that a misspelt name's did-you-mean never suggests one that would refuse it; at: where the request
    holds the name (a Workers AI route: its path).

    A name longer than MAX_REQUESTED_CHARS is refused (422) unread, quoted by its start and length; did-you-mean
    (difflib, quadratic) compares only names no longer than a served name may be.
    """
    if len(name) > MAX_REQUESTED_CHARS:
        raise RequestInvalid([Problem(at, f"the model name {shown(name)} is longer than "
                                      f"{MAX_REQUESTED_CHARS} characters, the most a request may send (served names "
                                      f"have at most {MAX_NAME_CHARS}); send a served model's name",
                                      "model_too_long")])
    if name in table:
        return table[name]
    near = did_you_mean(name, [n for n, model in table.items() if fits(model)]) if len(name) <= MAX_NAME_CHARS else ""
    raise UnknownModel(f"model {name!r} is not served here; {near}served: {', '.join(table)} (a "
                       "client that always sends its own name is served by adding it to a model's aliases in "
                       "models.toml)")


# --- keys ----------------------------------------------------------------------------------------

def _absolute(path: Path) -> Path:
    # abspath, not resolve(): a Hugging Face cache file is a symlink into blobs/, and its
    # joint_head_config.json lies beside the link, not beside the blob
    return Path(os.path.abspath(path))


def _combinations(spec: ModelSpec, where: str) -> list[str]:
    """Problems of keys that are valid alone but not together."""
    problems = []
    if spec.head_dtype != "f32" and spec.head_device == "cpu":
        problems.append(f"{where}.head_dtype: \"{spec.head_dtype}\" needs head_device = \"cuda\": on the CPU numpy "
                        "converts every matrix back to float32 on each request (the head runs up to 2x slower); "
                        "drop head_dtype or set head_device = \"cuda\"")
    if spec.encode.max_length > spec.backbone.n_ctx:
        problems.append(f"{where}: max_length ({spec.encode.max_length}) exceeds n_ctx ({spec.backbone.n_ctx}); a "
                        "prompt that long could not be decoded: raise n_ctx or lower max_length")
    return problems


def _model(name: str, raw: Any, base: Path, where: str, problems: list[str]) -> ModelSpec | None:
    if name_problem(name):
        problems.append(f"{where}: {name_problem(name)}")
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be a table")
        return None
    if "builtin" in raw:
        if "gguf" in raw or "head" in raw:
            problems.append(f"{where}: a builtin model takes no gguf or head")
        from ..demo.builtins import BUILTINS, demo_entry

        entry = demo_entry(raw["builtin"]) if raw["builtin"] in BUILTINS else {}
        raw = {**entry, **{k: v for k, v in raw.items() if k not in ("gguf", "head")}}
    elif "gguf" not in raw:
        problems.append(f"{where}.gguf: missing: the backbone GGUF file (a path relative to models.toml) is "
                        "required; `clef-bridge pull` writes complete entries")
    count = len(problems)
    groups = values_by_group(raw, MODEL_KEYS, where, problems)
    if len(problems) > count or "gguf" not in raw:
        return None
    top = groups.pop("", {})
    for key in ("gguf", "head_path", "pair", "mmproj", "lora"):
        if key in top:
            top[key] = _absolute(base / top[key])
    # the prefix cache is on unless prefix_cache_mb = 0; it keeps the head's memory rows with its checkpoints
    cache = PrefixCacheOptions(**groups.get("prefix", {}), payloads=True)
    spec = ModelSpec(name=name, **top, keys=frozenset(raw), backbone=BackboneOptions(**groups.get("backbone", {}),
                                                                                     prefix_cache=cache),
                     encode=EncodeOptions(**groups.get("encode", {})), answer=AnswerOptions(**groups.get("answer", {})))
    problems += _combinations(spec, where)
    return spec


def _server(raw: Any, base: Path, where: str, problems: list[str]) -> ServerSpec:
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be a table")
        return ServerSpec()
    groups = values_by_group(raw, SERVER_KEYS, where, problems)
    top = groups.get("", {})
    if "api_keys_file" in top:
        top["api_keys_file"] = _absolute(base / top["api_keys_file"])
    log = groups.get("decision_log", {})
    if "path" in log:  # a path ending in / names a folder, whether or not it exists yet
        folder = log["path"].endswith(("/", os.sep))
        log["path"] = _absolute(base / log["path"]) / (DECISION_LOG_NAME if folder else "")
    return ServerSpec(**top, limits=Limits(**groups.get("limits", {})),
                      images=ImageLimits(**groups.get("images", {})), audio=AudioLimits(**groups.get("audio", {})),
                      decoders=DecoderLimits(**groups.get("decoders", {})),
                      videos=VideoLimits(**groups.get("videos", {})), decision_log=DecisionLogSpec(**log))


def _ray(raw: Any, where: str, problems: list[str]) -> RaySpec:
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be a table")
        return RaySpec()
    count = len(problems)
    spec = RaySpec(**values_by_group(raw, RAY_KEYS, where, problems).get("", {}))
    if len(problems) == count and spec.min_replicas > spec.max_replicas:
        problems.append(f"{where}: min_replicas ({spec.min_replicas}) exceeds max_replicas ({spec.max_replicas})")
    return spec


def model_spec(name: str, gguf: str | Path, head: str | Path | None = None, base: Path = Path("."),
               **keys: Any) -> ModelSpec:
    """A ModelSpec from models.toml keys (validated exactly as the file is), for commands and tests."""
    raw = {"gguf": str(gguf), **({"head": str(head)} if head is not None else {}),
           **{k: str(v) if isinstance(v, Path) else v for k, v in keys.items()}}
    problems: list[str] = []
    spec = _model(name, raw, base, f"models.{shown(name)}", problems)
    if problems or spec is None:
        raise RegistryError("\n".join(problems))
    return spec


def with_keys(spec: ModelSpec, **keys: Any) -> ModelSpec:
    """spec with some models.toml keys changed (validated like the file)."""
    problems: list[str] = []
    keys = {k: str(v) if isinstance(v, Path) else v for k, v in keys.items()}
    groups = values_by_group(keys, MODEL_KEYS, f"models.{spec.name}", problems)
    if problems:
        raise RegistryError("\n".join(problems))
    top = groups.pop("", {})
    if "prefix" in groups:
        groups.setdefault("backbone", {})["prefix_cache"] = replace(spec.backbone.prefix_cache, **groups.pop("prefix"))
    nested = {g: replace(getattr(spec, g), **values) for g, values in groups.items()}
    changed = replace(spec, **top, **nested, keys=spec.keys | set(keys))
    problems = _combinations(changed, f"models.{spec.name}")
    if problems:
        raise RegistryError("\n".join(problems))
    return changed


def demo_registry(path: Path) -> Registry:
    """What `serve` uses when there is no models.toml: the built-in demo (text and images) and the Clef-omni demo
    (text, images, audio)."""
    from ..demo.builtins import BUILTINS, DEMO

    return parse_registry({"default": DEMO, "models": {n: {"builtin": n} for n in BUILTINS}}, path)


def file_registry(gguf: Path, head: Path | None = None, mmproj: Path | None = None) -> Registry:
    """One GGUF served as llama-server serves `-m FILE`: a model named after the file (its stem, with the file's
    name as an alias: the names a llama-server client sends), the default [server] keys."""
    gguf = _absolute(gguf)
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", gguf.stem)[:64] or "model"
    entry: dict[str, Any] = {"gguf": str(gguf), "aliases": [gguf.name]}
    if head is not None:
        entry["head"] = str(_absolute(head))
    if mmproj is not None:
        entry["mmproj"] = str(_absolute(mmproj))
    return parse_registry({"default": name, "models": {name: entry}}, gguf.parent / "models.toml")


def parse_registry(raw: dict[str, Any], path: Path) -> Registry:
    problems: list[str] = []
    top = ("default", "models", "server", "ray")
    for key in sorted(set(raw) - set(top)):
        problems.append(f"{key}: unknown top-level key; {did_you_mean(key, top)}known: {', '.join(top)}")
    models_raw = raw.get("models")
    if not isinstance(models_raw, dict) or not models_raw:
        raise RegistryError(f"{path}: no models; add a [models.NAME] table with at least gguf = \"...\"")
    specs = {name: _model(name, spec, path.parent, f"models.{shown(name)}", problems)
             for name, spec in models_raw.items()}
    default = raw.get("default", next(iter(models_raw)))
    if default not in models_raw:
        problems.append(f"default = {default!r} is not one of the models; {did_you_mean(default, models_raw)}models: "
                        f"{', '.join(sorted(map(shown, models_raw)))}")
    seen: dict[str, str] = {}
    for spec in filter(None, specs.values()):
        for n in (spec.name, *spec.aliases):
            if n in seen or n in DEFAULT_NAMES:
                problems.append(f"the name {n!r} is used twice (models.{shown(seen.get(n, spec.name))})")
            seen[n] = spec.name
    for spec in filter(None, specs.values()):
        for name in spec.shadow:
            if name == spec.name or name not in models_raw:
                problems.append(f"models.{shown(spec.name)}.shadow: {shown(name)} is "
                                f"{'the model itself' if name == spec.name else 'not one of the models'}; a shadow "
                                f"is another served model: {', '.join(sorted(map(shown, set(models_raw) - {spec.name})))}")
    server = _server(raw.get("server", {}), path.parent, "server", problems)
    ray = _ray(raw.get("ray", {}), "ray", problems)
    if problems:
        raise RegistryError(f"{path}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))
    return Registry(path=path, default=default, models={n: s for n, s in specs.items() if s}, server=server, ray=ray)


def load_registry(path: str | Path) -> Registry:
    path = _absolute(Path(path))
    try:
        if path.read_bytes()[:4] == b"GGUF":
            raise RegistryError(f"{path}: a GGUF model, not a models.toml",
                                fix=f"serve it alone with `clef-bridge serve {path}` (add --head or --mmproj where it "
                                    "needs them), or name it in a models.toml entry's gguf = ...")
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RegistryError(f"{path}: not found; pass --models PATH or create models.toml") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RegistryError(f"{path}: cannot parse: {exc}") from None
    return parse_registry(raw, path)
