"""bridge/config/registry_keys.py: each models.toml key checked by its table; problems collected, not raised."""

from __future__ import annotations

import dataclasses

import pytest
from clef_bridge.bridge.config.registry_keys import (
    MODEL_KEYS,
    RAY_KEYS,
    SERVER_KEYS,
    TEMPERATURE_KEYS,
    values_by_group,
)
from clef_bridge.head.schema import QUESTION_TYPES, Limits

pytestmark = pytest.mark.unit


def check(raw, keys=MODEL_KEYS):
    problems: list[str] = []
    return values_by_group(raw, keys, "models.m", problems), problems


def test_values_go_to_the_group_and_field_their_key_names():
    groups, problems = check({"gguf": "m.gguf", "n_ctx": 4096, "max_length": 2048, "prefix_cache_mb": 0,
                              "confidence": "jev"})
    assert not problems
    assert groups == {"": {"gguf": "m.gguf"}, "backbone": {"n_ctx": 4096}, "encode": {"max_length": 2048},
                      "prefix": {"max_mb": 0}, "answer": {"confidence": "jev"}}


def test_every_problem_of_a_table_is_collected_with_its_key():
    groups, problems = check({"n_ctx": 0, "n_ubatch": "big", "kv_type": "q8", "gguf": "m.gguf", "n_cxt": 1})
    assert groups == {"": {"gguf": "m.gguf"}}
    assert problems[:3] == ["models.m.n_ctx: must be positive, got 0", "models.m.n_ubatch: wrong type str",
                            "models.m.kv_type: must be one of ['f16', 'f32'], got 'q8'"]
    assert len(problems) == 4
    assert problems[3].startswith("models.m.n_cxt: unknown key; did you mean n_ctx? known keys: ")


def test_a_bool_is_not_a_number_but_is_a_bool():
    _, problems = check({"n_ctx": True, "truncate_state": True})
    assert problems == ["models.m.n_ctx: wrong type bool"]


def test_dtypes_read_in_any_spelling_and_are_stored_by_their_name():
    assert check({"head_dtype": "float16"})[0] == {"": {"head_dtype": "f16"}}
    assert check({"head_dtype": "F32"})[0] == {"": {"head_dtype": "f32"}}
    assert check({"head_dtype": "bf16"})[1] == ["models.m.head_dtype: must be one of ['f32', 'f16'], got 'bf16'"]


def test_gpu_layers_and_cpu_moe_take_auto_or_a_count():
    assert check({"n_gpu_layers": "auto", "n_cpu_moe": 3})[0] == {"backbone": {"n_gpu_layers": "auto",
                                                                               "n_cpu_moe": 3}}
    assert len(check({"n_gpu_layers": "all", "n_cpu_moe": -1})[1]) == 2


def test_pins_and_dates_are_checked_and_normalized():
    pin = "AB" * 32
    assert check({"gguf_sha256": pin})[0] == {"": {"gguf_sha256": pin.lower()}}
    assert check({"head_sha256": pin[:-1]})[1] == ["models.m.head_sha256: must be 64 hex digits"]
    assert check({"release_date": "2025-06-01"})[0] == {"": {"release_date": "2025-06-01"}}
    for bad in ("2025-6-1", "2025-02-30", "June"):
        assert check({"release_date": bad})[1] == [f"models.m.release_date: must be YYYY-MM-DD, got {bad!r}"]


def test_question_ids_blind_sets_the_flag():
    assert check({"question_ids": "blind"})[0] == {"encode": {"blind_ids": True}}
    assert check({"question_ids": "prompt"})[0] == {"encode": {"blind_ids": False}}
    assert check({"question_ids": "hidden"})[1]


def test_aliases_become_a_tuple_of_names():
    assert check({"aliases": ["a", "b"]})[0] == {"": {"aliases": ("a", "b")}}
    assert check({"aliases": ["a", ""]})[1] == ["models.m.aliases: must be a list of non-empty strings"]


def test_one_temperature_applies_to_every_question_type():
    assert check({"temperature": 2})[0] == {"answer": {"temperature": dict.fromkeys(QUESTION_TYPES, 2.0)}}


def test_temperatures_by_type_and_bucket():
    groups, problems = check({"temperature": {"choice": 1.5, "score.3_5": 0.5}})
    assert not problems and groups["answer"]["temperature"] == {"choice": 1.5, "score.3_5": 0.5}
    assert "choice.11" in TEMPERATURE_KEYS and "noul.2" in TEMPERATURE_KEYS
    problem, = check({"temperature": {"choise": 1.0}})[1]
    assert "unknown question type(s) ['choise']" in problem
    for bad in (0.001, 101, True, "1"):
        assert check({"temperature": {"choice": bad}})[1] == \
            [f"models.m.temperature: choice must be a number between 0.01 and 100, got {bad!r}"]


def test_server_keys_include_every_request_limit_and_the_media_limits():
    assert {f.name for f in dataclasses.fields(Limits)} <= set(SERVER_KEYS)
    groups, problems = check({"max_options": 8, "max_image_bytes": 1000, "max_audio_seconds": 0.5,
                              "request_timeout_s": 2.5}, SERVER_KEYS)
    assert not problems
    assert groups == {"limits": {"max_options": 8}, "images": {"max_bytes": 1000}, "audio": {"max_seconds": 0.5},
                      "": {"request_timeout_s": 2.5}}
    assert check({"max_audio_seconds": 0}, SERVER_KEYS)[1] == ["models.m.max_audio_seconds: must be above 0, got 0"]


def test_ray_takes_auto_or_a_count_of_gpus():
    assert check({"num_gpus": "auto", "num_cpus": 0.5}, RAY_KEYS)[0] == {"": {"num_gpus": "auto", "num_cpus": 0.5}}
    assert len(check({"num_gpus": "all", "num_cpus": 0, "upscale_delay_s": -1}, RAY_KEYS)[1]) == 3
