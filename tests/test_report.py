"""clef-bridge report (issue 53 item 3) on decision logs written line by line with known content: accuracy, Brier and
ECE against labels computed by hand, the shadows' agreement on constructed lines, drift buckets, rotated files read
oldest first, a torn last line never read, a batch's labels joined by state_sha256, the temperature fitted on the logged
probabilities against calibrate's fit on the logits, --json's shape, the plots, and the exit codes."""

from __future__ import annotations

import json
import math

import numpy as np
import orjson
import pytest
from clef_bridge.bridge.server.decision_log import Entry, record
from clef_bridge.bridge.service.decision import Decision as Logged
from clef_bridge.head.answer import ChoiceAnswer, NoulAnswer, ScoreAnswer, softmax64
from clef_bridge.tools import plots
from clef_bridge.tools.calibrate import calibrate_items
from clef_bridge.tools.cli import main
from clef_bridge.tools.evaldata import DataError
from clef_bridge.tools.logdata import LogError, load_labels
from clef_bridge.tools.render import text
from clef_bridge.tools.report import build_report, write_plots

pytestmark = pytest.mark.unit


def noul(qid, p):
    return {"id": qid, "type": "noul", "options": ["true", "false"], "answer": {"noul": p}}


def choice(qid, probabilities, options=None):
    top = max(probabilities, key=probabilities.get)
    return {"id": qid, "type": "choice", "options": options or list(probabilities),
            "answer": {"choice": top, "confidence": probabilities[top], "probabilities": probabilities}}


def line(rid, time, *questions, model="m", sha=None, shadows=None):
    out = {"time": time, "request_id": rid, "route": "/v1/systemone", "tenant": "alice", "model": model,
           "requested": model, "questions": list(questions), "input_tokens": 10, "state_sha256": sha or f"sha-{rid}"}
    if shadows:
        out["shadows"] = [{"model": name, "questions": list(qs)} for name, qs in shadows.items()]
    return out


def write(path, lines, tail=b""):
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines) + tail)
    return path


def labels_file(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


DAY1, DAY2 = "2026-12-01T{}:00:00.000Z", "2026-12-02T{}:00:00.000Z"


def test_accuracy_brier_and_ece_against_labels_by_hand(tmp_path):
    # noul p(true) 0.9, 0.9, 0.6, 0.45 labelled true, false, true, true: right, wrong, right, wrong (0.45 -> false)
    log = write(tmp_path / "decisions.jsonl", [line(f"r{i}", DAY1.format("10"), noul("urgent", p))
                                               for i, p in enumerate([0.9, 0.9, 0.6, 0.45])])
    labels = labels_file(tmp_path / "labels.jsonl", [
        {"request_id": "r0", "question": "urgent", "label": True},
        {"request_id": "r1", "question": "urgent", "label": False},
        {"request_id": "r2", "question": "urgent", "label": "true"},
        {"request_id": "r3", "question": "urgent", "label": True}])
    result = build_report(log, labels)
    assert result.labels.joined == 4 and result.labels.unmatched == result.labels.ambiguous == 0
    everything, nouls = result.quality
    assert (everything.model, everything.type, nouls.type) == ("m", "all", "noul")
    assert nouls.n == 4 and nouls.accuracy == pytest.approx(0.5)
    # Brier: sum over both options of (p - y)^2 = 2 (p_gold - 1)^2 for two options
    assert nouls.brier == pytest.approx((2 * 0.1 ** 2 + 2 * 0.9 ** 2 + 2 * 0.4 ** 2 + 2 * 0.55 ** 2) / 4)
    # ECE, 15 bins: confidences 0.9, 0.9 (bin 13: hits 1/2), 0.6 (bin 9: hit), 0.55 (bin 8: miss)
    assert nouls.ece == pytest.approx(2 / 4 * abs(0.5 - 0.9) + 1 / 4 * abs(1 - 0.6) + 1 / 4 * abs(0 - 0.55))
    assert nouls.nll == pytest.approx(-(math.log(0.9) + math.log(0.1) + math.log(0.6) + math.log(0.45)) / 4)
    assert sorted(nouls.reliability) == sorted([(0.55, 0.0, 1), (0.6, 1.0, 1), (0.9, 0.5, 2)])
    assert not nouls.calibration.accepted and "too little data" in nouls.calibration.reason
    assert everything.calibration is None and everything.brier == pytest.approx(nouls.brier)


def test_choice_and_score_labels_from_a_csv_with_a_label_that_is_no_option(tmp_path):
    log = write(tmp_path / "decisions.jsonl", [
        line("a", DAY1.format("10"), choice("team", {"billing": 0.2, "tech": 0.8}),
             {"id": "mood", "type": "score", "options": ["0", "1", "2"],
              "answer": {"score": 1.0, "confidence": 0.5, "probabilities": {"0": 0.25, "1": 0.5, "2": 0.25}}}),
        line("b", DAY1.format("11"), choice("team", {"billing": 0.6, "tech": 0.4}))])
    labels = tmp_path / "labels.csv"
    labels.write_text("request_id,question,label\na,team,tech\na,mood,2\nb,team,sales\nc,team,tech\n")
    result = build_report(log, labels)
    j = result.labels
    assert (j.rows, j.joined, j.unmatched, j.ambiguous, j.invalid) == (4, 3, 1, 0, 1)
    assert any("'sales'" in p and "line 4" in p for p in j.problems)
    assert any("line 5" in p and "'c'" in p for p in j.problems)  # the header is line 1
    by_type = {q.type: q for q in result.quality}
    assert by_type["choice"].n == 1 and by_type["choice"].accuracy == 1.0
    assert by_type["choice"].brier == pytest.approx(0.2 ** 2 + 0.2 ** 2)
    assert by_type["score"].n == 1 and by_type["score"].accuracy == 0.0  # level 1 on top, labelled 2
    assert by_type["score"].brier == pytest.approx(0.25 ** 2 + 0.5 ** 2 + 0.75 ** 2)
    assert by_type["all"].n == 2 and by_type["all"].accuracy == 0.5


def test_shadow_agreement_per_question_and_pair(tmp_path):
    primary = [noul("urgent", 0.8), choice("team", {"billing": 0.7, "tech": 0.3})]
    log = write(tmp_path / "decisions.jsonl", [
        line("r1", DAY1.format("10"), *primary, shadows={
            # the shadow lists the options in another order: compared by name
            "big": [noul("urgent", 0.4), choice("team", {"tech": 0.4, "billing": 0.6})],
            "other": [noul("urgent", 0.8)]}),
        line("r2", DAY1.format("11"), *primary, shadows={
            "big": [noul("urgent", 0.7), choice("team", {"billing": 0.5, "sales": 0.5})]}),
        line("r3", DAY1.format("12"), *primary)])
    result = build_report(log)
    assert result.shadow_models == {"big": 2, "other": 1}
    big, other = result.agreement
    assert (big.model, big.shadow, big.lines, big.missing, big.mismatched) == ("m", "big", 2, 0, 1)
    team, urgent = big.questions
    assert (team.question, team.n, team.agree) == ("team", 1, 1)
    assert team.mean_abs_dp == pytest.approx(0.1) and team.max_abs_dp == pytest.approx(0.1)
    assert (urgent.question, urgent.n, urgent.agree) == ("urgent", 2, 1)  # 0.8 vs 0.4 flips, 0.8 vs 0.7 does not
    assert urgent.mean_abs_dp == pytest.approx((0.4 + 0.1) / 2) and urgent.max_abs_dp == pytest.approx(0.4)
    assert (big.overall.n, big.overall.agree) == (3, 2)
    assert big.overall.mean_abs_dp == pytest.approx((0.4 * 2 + 0.1 * 2 + 0.1 * 2) / 6)
    assert big.overall.max_abs_dp == pytest.approx(0.4)
    assert (other.shadow, other.lines, other.missing, other.overall.n, other.overall.agree) == ("other", 1, 1, 1, 1)
    assert other.overall.max_abs_dp == 0.0


def test_drift_buckets_and_the_largest_change(tmp_path):
    log = write(tmp_path / "decisions.jsonl", [
        line("a", DAY1.format("01"), choice("team", {"billing": 0.9, "tech": 0.1})),
        line("b", DAY1.format("23"), choice("team", {"billing": 0.7, "tech": 0.3})),
        line("c", DAY2.format("05"), choice("team", {"billing": 0.2, "tech": 0.8})),
        line("d", "not a time", choice("team", {"billing": 0.2, "tech": 0.8}))])
    (d,) = build_report(log).drift
    assert (d.model, d.question, d.type, d.options, d.n) == ("m", "team", "choice", ("billing", "tech"), 3)
    first, last = d.buckets
    assert first.start.isoformat() == "2026-12-01T00:00:00+00:00" and first.n == 2
    assert first.top_share == {"billing": 1.0, "tech": 0.0}
    assert first.mean_p == pytest.approx({"billing": 0.8, "tech": 0.2})
    assert last.n == 1 and last.top_share == {"billing": 0.0, "tech": 1.0}
    assert (d.top_change.option, d.top_change.first, d.top_change.last) == ("billing", 1.0, 0.0)
    assert d.p_change.option == "billing" and d.p_change.delta == pytest.approx(0.2 - 0.8)
    hourly = build_report(log, bucket_hours=1).drift[0]
    assert [b.n for b in hourly.buckets] == [1, 1, 1]
    assert build_report(log).untimed == 1


def test_rotated_files_oldest_first_a_torn_line_and_a_real_record(tmp_path):
    decision = Logged("tiny", "jev-latest", (
        NoulAnswer("urgent", 0.25), ChoiceAnswer("team", "tech", 0.8, (("billing", 0.2), ("tech", 0.8))),
        ScoreAnswer("mood", 1.2, 0.5, (("0", "calm"), ("1", "annoyed"), ("2", "angry")),
                    (("0", 0.15), ("1", 0.5), ("2", 0.35)))), 10, {"queue": 0.001}, 0, 1, state="refund me")
    real = record(Entry(1.7646e9, "real", "/v1/systemone", "alice", decision), False)  # 2025-12-01
    write(tmp_path / "decisions.jsonl.2", [real])
    write(tmp_path / "decisions.jsonl.1", [line("mid", DAY1.format("10"), noul("urgent", 0.5)),
                                          {"note": "not a decision"}])
    write(tmp_path / "decisions.jsonl", [line("new", DAY2.format("10"), noul("urgent", 0.5))],
          tail=b'{"time": "2026-12-03T00:00:00.000Z", "request_id": "torn", "questions": [{"id"')
    result = build_report(tmp_path)
    assert [f.rsplit("/", 1)[1] for f in result.files] == ["decisions.jsonl.2", "decisions.jsonl.1", "decisions.jsonl"]
    assert (result.decisions, result.skipped) == (3, 1)
    assert result.first.startswith("2025-12-01") and result.last == "2026-12-02T10:00:00.000Z"
    assert result.models == {"m": 2, "tiny": 1}
    drift = {(d.model, d.question): d for d in result.drift}
    assert set(drift) == {("m", "urgent"), ("tiny", "urgent"), ("tiny", "team"), ("tiny", "mood")}
    assert drift["tiny", "mood"].buckets[0].mean_p == pytest.approx({"0": 0.15, "1": 0.5, "2": 0.35})
    assert drift["tiny", "urgent"].buckets[0].top_share == {"true": 0.0, "false": 1.0}
    assert build_report(tmp_path / "decisions.jsonl").files == result.files  # the file names its rotated ones


def test_a_batch_joins_by_state_sha256(tmp_path):
    log = write(tmp_path / "decisions.jsonl", [line("batch", DAY1.format("10"), noul("urgent", 0.9), sha="s1"),
                                               line("batch", DAY1.format("10"), noul("urgent", 0.2), sha="s2")])
    ambiguous = build_report(log, labels_file(tmp_path / "a.jsonl", [
        {"request_id": "batch", "question": "urgent", "label": True}])).labels
    assert (ambiguous.joined, ambiguous.ambiguous) == (0, 1) and "state_sha256" in ambiguous.problems[0]
    result = build_report(log, labels_file(tmp_path / "b.jsonl", [
        {"request_id": "batch", "question": "urgent", "label": True, "state_sha256": "s1"},
        {"request_id": "batch", "question": "urgent", "label": True, "state_sha256": "s2"}]))
    assert result.labels.joined == 2 and result.quality[1].accuracy == 0.5


def test_the_temperature_is_calibrates_fit_on_the_logits(tmp_path):
    """Fitted on log p of answers made at T = 0.5, the factor times 0.5 is what calibrate fits on the logits."""
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 1.5, (40, 3))
    golds = [int(rng.choice(3, p=softmax64(z))) for z in logits]  # the labels follow T = 1
    options = ["a", "b", "c"]
    lines, rows = [], []
    for i, (z, g) in enumerate(zip(logits, golds)):
        p = softmax64(z, 0.5)
        lines.append(line(f"r{i}", DAY1.format("10"), choice("q", {o: round(float(v), 4) for o, v in zip(options, p)})))
        rows.append({"request_id": f"r{i}", "question": "q", "label": options[g]})
    result = build_report(write(tmp_path / "decisions.jsonl", lines), labels_file(tmp_path / "l.jsonl", rows))
    fit = result.quality[1].calibration
    direct = calibrate_items("choice", list(zip(logits, golds)), 0.5)
    assert fit.n == 40 and fit.fitted * 0.5 == pytest.approx(direct.fitted, rel=0.02)
    assert fit.accepted == direct.accepted


def test_json_shape_and_text(tmp_path, capsys):
    log = write(tmp_path / "decisions.jsonl", [
        line("r1", DAY1.format("10"), noul("urgent", 0.8), shadows={"big": [noul("urgent", 0.6)]})])
    labels = labels_file(tmp_path / "l.jsonl", [{"request_id": "r1", "question": "urgent", "label": True}])
    assert main(["report", str(log), "--labels", str(labels), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"log", "files", "decisions", "skipped", "untimed", "first", "last", "models", "shadow_models",
                        "bucket_hours", "agreement", "drift", "labels", "quality"}
    assert out["agreement"][0]["questions"][0] == {"question": "urgent", "type": "noul", "n": 1, "agree": 1,
                                                   "agreement": 1.0, "mean_abs_dp": 0.2, "max_abs_dp": 0.2}
    assert out["drift"][0]["buckets"][0]["start"] == "2026-12-01T00:00:00Z"
    assert out["drift"][0]["largest_change"] == {"top_share": None, "mean_p": None}
    models = {(q["model"], q["type"]) for q in out["quality"]}
    assert models == {("m", "all"), ("m", "noul"), ("big", "all"), ("big", "noul")}
    noul_m = next(q for q in out["quality"] if q["model"] == "m" and q["type"] == "noul")
    assert noul_m["temperature"]["accepted"] is False and noul_m["temperature"]["suggested"] == 1.0
    assert "NaN" not in json.dumps(out)
    assert main(["report", str(log)]) == 0
    shown = capsys.readouterr().out
    assert "m vs big" in shown and "m / urgent (noul)" in shown and "no labels" in shown


def test_plots_or_the_note_that_matplotlib_is_missing(tmp_path, monkeypatch):
    log = write(tmp_path / "decisions.jsonl", [line("r1", DAY1.format("10"), noul("urgent", 0.8)),
                                               line("r2", DAY2.format("10"), noul("urgent", 0.3))])
    result = build_report(log, labels_file(tmp_path / "l.jsonl", [{"request_id": "r1", "question": "urgent",
                                                                     "label": True}]))
    if plots.available():
        notes = write_plots(result, tmp_path / "plots")
        assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["drift-m-urgent.png", "reliability-m.png"]
        assert all(n.startswith("wrote ") for n in notes)
    monkeypatch.setattr(plots, "available", lambda: False)
    (note,) = write_plots(result, tmp_path / "none")
    assert "matplotlib is not installed" in note and not (tmp_path / "none").exists()


def test_exit_codes_and_what_they_say(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "decisions.jsonl"
    assert main(["report", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2  # a folder without decisions.jsonl
    assert "holds no decisions.jsonl" in capsys.readouterr().err
    empty = tmp_path / "decisions.jsonl"
    empty.write_bytes(b'{"time": "2026-12-01T00:00:00.000Z", "questions": [')  # only a torn line
    assert main(["report", str(empty)]) == 1
    assert "no decisions in the decision log" in capsys.readouterr().out
    assert main(["report", str(empty), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["decisions"] == 0
    write(empty, [line("r1", DAY1.format("10"), noul("urgent", 0.8))])
    bad = tmp_path / "labels.jsonl"
    bad.write_text('{"request_id": "r1", "question": "urgent", "label": true}\nnot json\n'
                   '{"request_id": "r1", "question": "urgent", "label": false}\n{"request_id": "r1"}\n')
    assert main(["report", str(empty), "--labels", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 2: not JSON" in err and "line 3: a second label" in err and "line 4: question" in err
    with pytest.raises(SystemExit) as stop:
        main(["report", str(empty), "--bucket", "0"])
    assert stop.value.code == 2
    assert main(["report", str(empty), "--labels", str(tmp_path / "absent.csv")]) == 2
    assert main(["report", str(empty)]) == 0


def test_labels_files_checked_on_load(tmp_path):
    csv = tmp_path / "labels.csv"
    csv.write_text("request_id,question\nr1,urgent\n")
    with pytest.raises(DataError, match="label missing"):
        load_labels(csv)
    csv.write_text("request_id,question,label,state_sha256\nr1,urgent,true,\nr2,urgent,false,abc\n")
    first, second = load_labels(csv)
    assert (first.line, first.label, first.state_sha256) == (2, "true", None)
    assert second.state_sha256 == "abc"
    with pytest.raises(LogError, match="no decision log"):
        build_report(tmp_path / "absent.jsonl")


def test_text_names_the_numbers(tmp_path):
    log = write(tmp_path / "decisions.jsonl", [line("r1", DAY1.format("10"), noul("urgent", 0.9)),
                                               line("r2", DAY2.format("10"), noul("urgent", 0.3))])
    labels = labels_file(tmp_path / "l.jsonl", [{"request_id": "r1", "question": "urgent", "label": True},
                                                 {"request_id": "r2", "question": "urgent", "label": True}])
    shown = text(build_report(log, labels))
    assert "2 decisions in 1 file(s)" in shown
    assert "top answer 'true' 100.0% -> 0.0% (-100.0 points)" in shown
    assert "labels " in shown and "2 rows, 2 joined" in shown
    assert "0.5000" in shown  # accuracy
    assert "T x " in shown and "too little data" in shown


def test_the_text_shows_eight_buckets_and_odd_lines_are_skipped(tmp_path):
    lines = [line(f"r{h}", DAY1.format(f"{h:02d}"), noul("urgent", 0.5 + h / 100)) for h in range(10)]
    lines += [{"questions": "not a list"}, line("x", DAY1.format("10"), noul("urgent", 1.5)),  # p out of range
              line("y", DAY1.format("10"), noul("urgent", 0.5)) | {"shadows": 5}]  # a line's shadows not a list
    result = build_report(write(tmp_path / "decisions.jsonl", lines), bucket_hours=1)
    assert (result.decisions, result.skipped, result.shadow_models) == (11, 2, {})
    shown = text(result)
    assert "11 buckets" in shown and "... 3 more buckets (--json lists them)" in shown
    assert "2026-12-01 03:00" in shown and "2026-12-01 04:00" not in shown and "2026-12-01 09:00" in shown


def test_shadows_as_the_server_writes_them(tmp_path):
    """The server's shadow entries carry an outcome, and their questions only an id and an answer (with its own
    agrees and max_abs_dp): type and options are the line's own question's."""
    primary = [noul("urgent", 0.8), choice("team", {"billing": 0.7, "tech": 0.3})]
    answered = {"model": "claims", "outcome": "answered", "questions": [
        {"id": "urgent", "answer": {"noul": 0.4}, "agrees": False, "max_abs_dp": 0.4},
        {"id": "team", "answer": {"choice": "billing", "confidence": 0.6,
                                  "probabilities": {"billing": 0.6, "tech": 0.4}}, "agrees": True, "max_abs_dp": 0.1}]}
    lines = [line("r1", DAY1.format("10"), *primary) | {"shadows": [answered]},
             line("r2", DAY1.format("11"), *primary) | {"shadows": [{"model": "claims", "outcome": "dropped"}]},
             line("r3", DAY1.format("12"), *primary) | {"shadows": [{"model": "claims", "outcome": "failed: busy"}]}]
    (pair,) = build_report(write(tmp_path / "decisions.jsonl", lines)).agreement
    assert (pair.lines, pair.outcomes, pair.missing) == (3, {"answered": 1, "dropped": 1, "failed: busy": 1}, 0)
    assert (pair.overall.n, pair.overall.agree) == (2, 1) and pair.overall.max_abs_dp == pytest.approx(0.4)
    assert "3 line(s) (answered 1, dropped 1, failed: busy 1)" in text(build_report(tmp_path))


def test_a_real_line_with_a_shadow_where_the_writer_has_them(tmp_path):
    from clef_bridge.bridge.server import decision_log

    from clef_bridge.head.answer import agreement

    mine = Logged("tiny", "tiny", (NoulAnswer("urgent", 0.8),), 10, {}, 0, 1, state="s")
    theirs = Logged("claims", "claims", (NoulAnswer("urgent", 0.3),), 10, {}, 0, 1, state="s")
    compared = {"urgent": agreement(mine.answers[0], theirs.answers[0])}  # what the shadow task hands the writer
    entry = Entry(1.7646e9, "r", "/v1/systemone", "alice", mine,
                  shadows=(decision_log.Shadow("claims", "answered", theirs, compared),))
    (pair,) = build_report(write(tmp_path / "decisions.jsonl", [record(entry, False)])).agreement
    (urgent,) = pair.questions
    assert (pair.shadow, urgent.question, urgent.type, urgent.n, urgent.agree) == ("claims", "urgent", "noul", 1, 0)
    assert urgent.max_abs_dp == pytest.approx(0.5)
