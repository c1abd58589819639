"""The measuring benchmarks of issue 51: `architecture` (the figures docs/architecture.md quotes) and `parsers` (own
code against pydantic and msgspec)."""

from __future__ import annotations

import json
import threading

import pytest

from benchmarks.__main__ import main
from benchmarks.architecture import Tracer, source_figures
from benchmarks.parsers import OWN, own_parsers, planted_body, small_bodies, weigh_agreement, weigh_planted

pytestmark = pytest.mark.integration  # git history in a subprocess


def test_the_source_figures_find_the_layers_they_count():
    types, problems, shapes = source_figures()
    assert {"head/schema.py", "head/answer.py"} <= set(types)
    assert {"head/schema.py", "bridge/server/doors/systemone_batch.py"} <= set(problems)
    # System One's response is written by the doors (and the OpenAPI document that describes it), not the service
    assert "bridge/server/doors/systemone.py" in shapes and "bridge/service/decision.py" not in shapes
    assert all(m.startswith("bridge/server/") for m in shapes), shapes


def test_the_tracer_counts_calls_entered_from_another_module_and_thread_hand_offs():
    import sys

    import benchmarks.architecture as module

    tracer = Tracer((module.__file__,))  # this module's own functions are not counted: only architecture.py's
    tracer.active = True

    def work() -> None:
        module._strings(module.ast.parse("x = 'a'"))

    threading.setprofile(tracer)
    sys.setprofile(tracer)
    try:
        work()
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    assert {name for _, name in tracer.functions} == {"_strings"} == {name for _, name in tracer.entered}
    assert tracer.calls == 2 and len(tracer.threads) == 2 and tracer.hand_offs == 1
    assert list(tracer.counts.values()) == [2]  # per function: what the "once" figures read


def test_each_once_step_names_a_function_that_exists():
    """A step renamed away would count 0 forever and read as "not on this path"."""
    import importlib

    from benchmarks.architecture import ONCE

    for path, qualname in ONCE.values():
        module = importlib.import_module("clef_bridge." + path.removesuffix(".py").replace("/", "."))
        target = module
        for part in qualname.split("."):
            target = getattr(target, part)
        assert callable(target), (path, qualname)


def test_own_code_reports_every_planted_problem_where_it_is():
    from clef_bridge.head.schema import Limits

    rows, summary = weigh_planted(own_parsers(Limits()))
    assert rows and all(row["found"][OWN] for row in rows), rows
    assert summary[OWN]["found"] == summary[OWN]["planted"] == summary[OWN]["located"]


def test_the_parsers_agree_with_own_code_on_generated_bodies():
    import random

    from clef_bridge.head.schema import Limits

    bodies, defects = small_bodies(random.Random(3), 200)
    agreement = weigh_agreement(own_parsers(Limits()), bodies, defects)
    assert agreement["agree"] == 200 and 0 < agreement["accepted"][OWN] < 200, agreement
    assert json.loads(planted_body())["questions"]


def test_architecture_prints_its_figures_without_a_server(capsys):
    assert main(["architecture", "--no-trace", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["traces"] == [] and {c["what"] for c in out["changes"]} >= {"the last door (Deqio)"}

