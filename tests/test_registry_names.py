"""What a model's name may be (bridge/config/registry_names.py): models.toml's names and aliases, `pull --name`, and
the bound on a request's `model` before it is looked up, compared (did-you-mean) or echoed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from clef_bridge.bridge.config import registry as registry_module
from clef_bridge.bridge.config.registry import RegistryError, UnknownModel, model_spec, parse_registry, resolve
from clef_bridge.bridge.config.registry_names import MAX_NAME_CHARS, MAX_REQUESTED_CHARS, name_problem, shown
from clef_bridge.head.errors import RequestInvalid
from clef_bridge.tools.pull import PullError, pull

pytestmark = pytest.mark.unit

# (a hostile character, its code point as the message names it)
HOSTILE = [("\n", "U+000A"), ("\r", "U+000D"), ("\x1b", "U+001B"), ("\x85", "U+0085"),
           ("\u202e", "U+202E RIGHT-TO-LEFT OVERRIDE"), ("\u200b", "U+200B ZERO WIDTH SPACE"),
           ("\u2066", "U+2066 LEFT-TO-RIGHT ISOLATE"), ("\u2028", "U+2028 LINE SEPARATOR"),
           ("\u2029", "U+2029 PARAGRAPH SEPARATOR"), ("\U000e0041", "U+E0041 TAG LATIN CAPITAL LETTER A"),
           ("\udcff", "U+DCFF")]


def registry(models: dict) -> Exception:
    with pytest.raises(RegistryError) as info:
        parse_registry({"models": models}, Path("/srv/models.toml"))
    return info.value


@pytest.mark.parametrize("ch, named", HOSTILE)
def test_a_name_with_a_control_format_or_separator_character_is_refused_by_code_point(ch, named):
    problem = name_problem(f"clef{ch}-evil")
    assert f"holds {named}," in problem and "at position 4" in problem


@pytest.mark.parametrize("name", ["clef-flash", "@cf/cloudflare/clef-omni", "jev-latest", "модель 2", "a" * 128,
                                  "it's $(not) `run`"])
def test_plain_names_pass(name):
    assert name_problem(name) == ""  # the shell's characters are the playground's quoting's business, not refused


def test_empty_and_absurdly_long_names_are_refused():
    assert name_problem("") == "a name must not be empty"
    assert name_problem("a" * (MAX_NAME_CHARS + 1)) == f"the name is {MAX_NAME_CHARS + 1} characters long; at most 128"


@pytest.mark.parametrize("ch, named", HOSTILE[:-1])  # TOML text cannot hold an unpaired surrogate
def test_models_toml_refuses_such_a_name_naming_the_entry_printably(ch, named):
    error = registry({f"evil{ch}name": {"builtin": "demo"}, "good": {"builtin": "demo"}})
    message = str(error)
    assert f"models.{repr(f'evil{ch}name')}: the name holds {named}" in message
    assert all(line.isprintable() for line in message.split("\n"))  # the bad character is never written out


def test_models_toml_refuses_such_an_alias_naming_the_entry_and_the_alias():
    message = str(registry({"demo": {"builtin": "demo", "aliases": ["fine", "x\u202ey"]}}))
    assert "models.demo.aliases: alias 1 ('x\\u202ey'): the name holds U+202E RIGHT-TO-LEFT OVERRIDE" in message
    assert "\u202e" not in message


def test_an_absurdly_long_name_is_refused_and_quoted_by_its_start():
    message = str(registry({"m" * 5000: {"builtin": "demo"}}))
    assert "the name is 5000 characters long; at most 128" in message and "(5000 characters)" in message
    assert len(message) < 400


def test_model_spec_follows_the_same_rule():
    with pytest.raises(RegistryError, match="U\\+2029 PARAGRAPH SEPARATOR"):
        model_spec("a\u2029b", "x.gguf")


def test_pull_refuses_a_bad_name_before_downloading(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing is asked of it: the refusal comes first
    with pytest.raises(PullError, match="--name 'x\\\\ny': the name holds U\\+000A"):
        pull("clef-flash", "some/repo", "file.gguf", tmp_path / "models.toml", name="x\ny")
    assert not (tmp_path / "models.toml").exists()


def test_shown_keeps_plain_names_and_escapes_or_cuts_the_rest():
    assert shown("clef-flash") == "clef-flash"
    assert shown("a\u202eb") == "'a\\u202eb'"
    assert shown("m" * 4_000_000) == f"{'m' * 32!r}... (4000000 characters)"


# --- a request's model ---------------------------------------------------------------------------

TABLE = {"clef-flash": "clef-flash", "clef": "clef-flash", "jev-latest": "clef-flash"}


def test_a_huge_requested_name_is_a_422_in_milliseconds_without_being_echoed(monkeypatch):
    compared = []
    monkeypatch.setattr(registry_module, "did_you_mean", lambda *a: compared.append(a) or "")
    name = "m" * 4_000_000
    t0 = time.perf_counter()
    with pytest.raises(RequestInvalid) as info:
        resolve(TABLE, name)
    assert time.perf_counter() - t0 < 0.05
    (problem,) = info.value.problems
    assert (problem.loc, problem.type) == (("body", "model"), "model_too_long")
    assert "4000000 characters" in problem.msg and f"longer than {MAX_REQUESTED_CHARS}" in problem.msg
    assert len(str(info.value)) < 400 and not compared


def test_the_bound_is_inclusive_and_did_you_mean_runs_only_for_names_a_model_may_have(monkeypatch):
    compared = []
    monkeypatch.setattr(registry_module, "did_you_mean", lambda word, choices: compared.append(word) or "")
    for name in ("clef-flsh", "c" * MAX_NAME_CHARS, "c" * (MAX_NAME_CHARS + 1), "c" * MAX_REQUESTED_CHARS):
        with pytest.raises(UnknownModel):
            resolve(TABLE, name)
    assert compared == ["clef-flsh", "c" * MAX_NAME_CHARS]
    with pytest.raises(RequestInvalid):
        resolve(TABLE, "c" * (MAX_REQUESTED_CHARS + 1))


def test_a_misspelt_short_name_still_gets_its_suggestion():
    with pytest.raises(UnknownModel, match="did you mean clef-flash\\?"):
        resolve(TABLE, "clef-flsh")
    assert resolve(TABLE, "clef") == "clef-flash"
