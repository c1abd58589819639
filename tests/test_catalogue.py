"""The catalogue (bridge/catalogue, head/media.py): its tables, and every place that once wrote its facts again
now derives them from it (architectures, releases, dtypes, media kinds, the CLI's choices, the GPU plan's inputs)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from clef_bridge.bridge.catalogue import architectures as arch
from clef_bridge.bridge.catalogue import dtypes, media, releases
from clef_bridge.head import media as head_media
from clef_bridge.head.config import HeadConfig
from clef_bridge.head.encoder import DEFAULT_MAX_LENGTH, MEDIA_LAYOUTS
from clef_bridge.head.errors import RequestInvalid
from clef_bridge.head.schema import MEDIA_FIELDS, parse_request

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


# --- the tables ------------------------------------------------------------------------------------

def test_architectures_and_their_capabilities():
    assert arch.CLEF_ARCHITECTURES == ("qwen35", "qwen35moe", "qwen3vlmoe", "clef")
    omni = arch.ARCHITECTURES["qwen3vlmoe"]
    assert omni.media == ("image", "audio", "video") and omni.experts and omni.deepstack and omni.full_attention
    assert omni.every_token_output and omni.kv_cells_only and omni.image_tokens == (64, 1024)
    for name in ("qwen35", "qwen35moe", "clef"):
        a = arch.ARCHITECTURES[name]
        assert a.media == ("image",) and not (a.deepstack or a.full_attention or a.every_token_output)
        assert a.image_tokens == (64, 16384) and a.pre_tokenizer == "qwen35"
    assert arch.ARCHITECTURES["qwen35moe"].experts and not arch.ARCHITECTURES["qwen35"].experts
    assert arch.CLEF.head_inside and arch.CLEF.loads_as == "qwen35"
    assert arch.NFC_PRE_TOKENIZERS == {"qwen2", "qwen35"}
    assert arch.DEEPSTACK_ARCHITECTURES == arch.FULL_ATTENTION_ARCHITECTURES == {"qwen3vlmoe"}
    assert arch.AUDIO_ARCHITECTURES == arch.EVERY_TOKEN_OUTPUT_ARCHITECTURES == {"qwen3vlmoe"}
    assert arch.image_tokens(None) == arch.image_tokens("llama") == (64, 16384)
    assert arch.architecture("llama") is None and arch.architecture("clef") is arch.CLEF
    assert [a.reference for a in arch.ARCHITECTURES.values()] == ["dense", "dense", "omni", "dense"]
    assert all(a.reference in MEDIA_LAYOUTS and a.reference in DEFAULT_MAX_LENGTH for a in arch.ARCHITECTURES.values())


def test_releases():
    assert list(releases.RELEASES) == ["clef-flash", "clef", "clef-omni"]
    assert {r.repo for r in releases.RELEASES.values()} == {"Cloudflare/clef-flash", "Cloudflare/clef",
                                                            "Cloudflare/clef-omni"}
    assert [r.backbone for r in releases.RELEASES.values()] == ["qwen35", "qwen35", "qwen3vlmoe"]
    assert releases.CLOUDFLARE_NAMES == {4096: "clef-flash", 5120: "clef"}
    assert releases.NAMED_BY_ARCHITECTURE == {"qwen3vlmoe": "clef-omni"}
    assert releases.REAL_RELEASES == {"demo": "clef-flash", "demo-omni": "clef-omni"}
    assert all(set(r.architectures) <= set(arch.ARCHITECTURES) for r in releases.RELEASES.values())


def test_dtypes():
    assert list(dtypes.DTYPES) == ["f32", "f16", "bf16", "q8_0"]
    assert {n: d.nbytes for n, d in dtypes.DTYPES.items()} == {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 34 / 32}
    assert dtypes.HEAD_DTYPES == ("f32", "f16") and dtypes.KV_CACHE_DTYPES == ("f16", "f32")  # the default first
    assert dtypes.SPLIT_DTYPES == ("f32", "f16", "bf16") and dtypes.JOIN_DTYPES == tuple(dtypes.DTYPES)
    assert all(dtypes.dtype_name(d.ggml) == n for n, d in dtypes.DTYPES.items())  # F16 reads as f16
    assert all(dtypes.dtype_name(alias) in dtypes.DTYPES for alias in dtypes.DTYPE_ALIASES)


def test_media_kinds():
    assert media.MEDIA_KINDS is head_media.MEDIA_KINDS  # head/ holds the words, without importing bridge/
    assert media.READABLE == ("image", "audio", "video")
    assert media.FIELDS == ("images", "audio", "videos", "assets")
    assert [k.error_type for k in media.MEDIA_KINDS.values()] == ["images_not_supported", "audio_not_supported",
                                                                   "videos_not_supported"]


# --- drift A: the text-only path refuses every medium ----------------------------------------------

def body(**extra):
    return {"model": "m", "state": "s", "questions": {"q": {"type": "noul"}}, **extra}


@pytest.mark.parametrize("field, error_type", [("images", "images_not_supported"), ("audio", "audio_not_supported"),
                                               ("videos", "videos_not_supported"), ("assets", "images_not_supported")])
def test_parse_request_refuses_every_media_field(field, error_type):
    """An `audio` field was accepted and ignored (MEDIA_FIELDS lacked it): a tool that parses text only, such as
    `drift`, answered a request with audio as if it were text."""
    with pytest.raises(RequestInvalid) as info:
        parse_request(body(**{field: ["x"] if field != "assets" else {"a": {}}}))
    [problem] = info.value.problems
    assert problem.loc == ("body", field) and problem.type == error_type


def test_a_data_file_with_audio_is_refused_not_read_as_text(tmp_path):
    """`drift`, `eval` and `calibrate` read their data through parse_request: a line with audio is refused (the
    issue's check: `drift A.gguf B.gguf --data` reported decisions for it, as if it held text only)."""
    from clef_bridge.tools.evaldata import DataError, load_examples

    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"request": body(audio=["UklGRg=="])}) + "\n" + json.dumps({"request": body()}) + "\n")
    with pytest.raises(DataError, match="line 1: invalid request.*audio"):
        load_examples(data)


def test_media_fields_are_derived_from_the_kinds():
    assert set(MEDIA_FIELDS) == set(media.FIELDS)
    assert parse_request(body(audio=[])).questions  # an empty list carries nothing


# --- every place derives from the catalogue -------------------------------------------------------

def test_the_gguf_and_llama_rooms_derive():
    from clef_bridge.bridge.gguf import clef_format, clef_split, projector
    from clef_bridge.bridge.llama import backbone, omni, vision

    assert (clef_format.CLEF_ARCH, clef_format.BACKBONE_ARCH) == ("clef", "qwen35")
    assert {n: q.name for n, q in clef_format.HEAD_TYPES.items()} == {"f32": "F32", "f16": "F16", "bf16": "BF16",
                                                                     "q8_0": "Q8_0"}
    assert clef_split.SAFETENSORS_TYPES == {"f32": "F32", "f16": "F16", "bf16": "BF16"}
    assert projector.max_image_tokens("qwen3vlmoe") == 1024 and projector.max_image_tokens("qwen35") == 16384
    assert projector.MAX_IMAGE_TOKENS == arch.QWEN35.image_tokens[1]
    assert set(backbone.GGML_KV_TYPES) == set(dtypes.KV_CACHE_DTYPES)
    assert backbone.NFC_PRE_TOKENIZERS is arch.NFC_PRE_TOKENIZERS
    assert omni.OMNI_ARCH == arch.QWEN3VLMOE.name
    assert (vision.ProjectorOptions.min_tokens, vision.ProjectorOptions.max_tokens) == arch.QWEN35.image_tokens


def test_the_config_room_derives():
    from clef_bridge.bridge.config import integrity, memory_plan, presets, registry_keys

    assert integrity.CLEF_ARCHITECTURES == arch.CLEF_ARCHITECTURES
    assert memory_plan.KV_BYTES == {n: d.nbytes for n, d in dtypes.DTYPES.items()}
    assert set(presets.ARCHES) == set(releases.RELEASES)
    assert all(presets.ARCHES[n]["n_embd"] == r.width for n, r in releases.RELEASES.items())
    kv = registry_keys.MODEL_KEYS["kv_type"].check
    assert [kv(t) for t in dtypes.KV_CACHE_DTYPES] == list(dtypes.KV_CACHE_DTYPES)
    with pytest.raises(registry_keys._Bad):
        kv("bf16")
    assert registry_keys.MODEL_KEYS["head_dtype"].check("float16") == "f16"
    builtin = registry_keys.MODEL_KEYS["builtin"].check
    assert [builtin(b) for b in releases.REAL_RELEASES] == list(releases.REAL_RELEASES)


def test_the_demo_and_the_tools_derive():
    from clef_bridge.bridge.demo import builtins, moe
    from clef_bridge.tools import checks, cliargs, pull

    assert builtins.REAL_RELEASES is releases.REAL_RELEASES and builtins.BUILTINS == ("demo", "demo-omni")
    assert moe.ARCH == "qwen3vlmoe"
    assert pull.RELEASES is cliargs.RELEASES is releases.RELEASES
    assert checks.RELEASE_BY_WIDTH == {4096: "Cloudflare/clef-flash", 5120: "Cloudflare/clef"}


def test_inline_bytes_is_written_once():
    """One module assigns it (the service's); the server's body reader imports that one."""
    from clef_bridge.bridge.server.doors import decisions
    from clef_bridge.bridge.service import decision

    root = Path(__file__).resolve().parent.parent
    assigning = sorted(str(p.relative_to(root)) for d in ("bridge", "head", "tools") for p in (root / d).rglob("*.py")
                       if re.search(r"^\s*INLINE_BYTES\s*[:=]", p.read_text(encoding="utf-8"), re.M))
    assert assigning == ["bridge/service/decision.py"]
    assert decisions.INLINE_BYTES is decision.INLINE_BYTES


def test_no_module_writes_an_architecture_or_release_name_again():
    """Outside the catalogue, an architecture's or release's name is never a string of its own (messages and
    docstrings may still say them)."""
    names = set(arch.ARCHITECTURES) - {"clef"} | set(releases.RELEASES) - {"clef"}  # "clef" is also a key prefix
    found = []
    for package in ("head", "bridge", "tools"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "catalogue" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value in names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not found


# --- the CLI's choices -------------------------------------------------------------------------------

def choices(command: str, flag: str) -> list[str]:
    from clef_bridge.tools.cliargs import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return list(next(a for a in sub._actions if flag in a.option_strings or a.dest == flag).choices)


def test_cli_choices_come_from_the_catalogue():
    assert choices("fit", "--arch") == choices("pull", "model") == list(releases.RELEASES)
    assert choices("fit", "--head-dtype") == list(dtypes.HEAD_DTYPES)
    assert choices("split", "--head-dtype") == list(dtypes.SPLIT_DTYPES)
    assert choices("join", "--head-dtype") == list(dtypes.JOIN_DTYPES)


def test_one_flag_name_for_the_heads_dtype():
    """`split --head-dtype` and `join --head-dtype`; join's old `--head-type` still reads (deprecated)."""
    from clef_bridge.tools.cliargs import build_parser

    parser = build_parser()
    for flag in ("--head-dtype", "--head-type"):
        args = parser.parse_args(["join", "b.gguf", "h.safetensors", "-o", "o.gguf", flag, "BF16"])
        assert args.head_dtype == "bf16"
    assert parser.parse_args(["split", "c.gguf", "-o", "out", "--head-dtype", "f16"]).head_dtype == "f16"


# --- the GPU plan's inputs: one function --------------------------------------------------------------

def test_plan_inputs_put_the_audio_tower_with_the_head():
    from clef_bridge.bridge.config.memory_plan import ProjectorSizes, head_gpu_bytes, plan_inputs

    cfg = HeadConfig(hidden_size=64, width=32, routing_layers=1, layers=1, heads=2, feedforward=64)
    sizes = ProjectorSizes(1000, 200, 30)
    on_gpu, on_cpu = plan_inputs(cfg, "cuda", "f16", sizes), plan_inputs(cfg, "cpu", "f16", sizes)
    assert on_gpu.head_bytes == head_gpu_bytes(cfg, "cuda", "f16") > 0 and on_cpu.head_bytes == 0
    assert (on_gpu.media_bytes, on_cpu.media_bytes) == (1230, 1200)
    assert plan_inputs(cfg, "cuda", "f32", None).media_bytes == 0


def test_projector_sizes_take_the_backbones_largest_image():
    from clef_bridge.bridge.config.memory_plan import projector_sizes
    from clef_bridge.bridge.gguf.projector import ProjectorInfo, compute_bytes

    info = ProjectorInfo("qwen3vl_merger", 64, 16, 2, True, 5000, 32, 64, audio_float32_bytes=700)
    omni, qwen35 = projector_sizes(info, "qwen3vlmoe"), projector_sizes(info, "qwen35")
    assert omni.vision_compute_bytes == compute_bytes(info, 1024) < qwen35.vision_compute_bytes
    assert qwen35.vision_compute_bytes == compute_bytes(info, 16384)
    assert (omni.vision_weight_bytes, omni.audio_weight_bytes) == (5000, 700)


def test_loading_and_fit_call_the_one_function():
    """The memory plan's inputs were computed in loading.py and again in fit.py (three fixes were drift between
    the copies): both call plan_inputs now, and neither counts a projector or the head on its own."""
    for module in ("bridge/model/loading.py", "tools/fit.py"):
        tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert {"plan_inputs", "projector_sizes"} <= called, module
        assert not called & {"compute_bytes", "head_gpu_bytes", "max_image_tokens"}, module


def test_every_supported_medium_has_its_limits_and_body_room():
    """A medium a model may take is capped in the body and in decoding by its own limits (ServerSpec.media_limits)."""
    from clef_bridge.bridge.config.registry import ServerSpec
    from clef_bridge.bridge.media.audio import AudioLimits
    from clef_bridge.bridge.media.images import ImageLimits
    from clef_bridge.bridge.server.assets import body_limit

    spec = ServerSpec(max_body_bytes=100, images=ImageLimits(max_images=2, max_total_bytes=3000),
                      audio=AudioLimits(max_clips=1, max_bytes=300))
    supported = {kind.name for kind in head_media.MEDIA_KINDS.values() if kind.supported}
    assert set(spec.media_limits) == supported
    assert body_limit(spec, ["image"]) == 100 + 4000 + 2 * 4096
    assert body_limit(spec, ["audio", "image", "audio"]) == 100 + 4000 + 2 * 4096 + 400 + 4096



def reaches_pull(command: str, monkeypatch) -> bool:
    """Whether `clef-bridge pull ...`, as printed, parses and gets past the CLI's checks to the download."""
    import shlex

    from clef_bridge.tools import cli
    from clef_bridge.tools import pull as pull_module
    from clef_bridge.tools.cliargs import build_parser

    class Reached(Exception):
        pass

    def fake_pull(*args, **kwargs):
        raise Reached(args)

    monkeypatch.setattr(pull_module, "pull", fake_pull)
    words = shlex.split(command)
    assert words[:2] == ["clef-bridge", "pull"], command
    try:
        cli._pull(build_parser().parse_args(words[1:]))
    except Reached:
        return True
    except cli.UsageError:
        return False
    return False


@pytest.mark.parametrize("release", list(releases.RELEASES))
def test_the_printed_pull_command_is_taken_as_shown(monkeypatch, release):
    """The banner and the demos' warnings print `pull_command`: `pull` must get that far, not refuse its flags."""
    command = releases.RELEASES[release].pull_command
    assert command.split()[2] == release and reaches_pull(command, monkeypatch)
    assert not reaches_pull(f"clef-bridge pull {release}", monkeypatch)  # what the banner printed before
