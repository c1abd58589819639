"""The GPU path without a GPU: the pipeline and the worker's two threads on the strict CuPy stand-in
(tests/strictcupy.py), the one-copy upload from pinned rows, the explicit synchronisation before
llama.cpp's output buffer is read, CuPy out-of-memory over a real socket, and the memory plan with
NVML and CuPy faked. The GPU run itself is tools/gpu_check.sh."""

from __future__ import annotations

import json
import sys
import types

import llama_cpp
import numpy as np
import pytest
from clef_bridge.bridge.config import memory_plan as fit
from clef_bridge.bridge.config.registry import RegistryError
from clef_bridge.bridge.host.gpu import host_rows_for, read_gpu, visible_device
from clef_bridge.bridge.llama import backbone as backbone_module
from clef_bridge.head.config import config_path_for, load_config
from clef_bridge.head.errors import HeadConfigError
from clef_bridge.head.weights import stored_bytes
from clef_bridge.tools.cli import main

from .conftest import open_spec, tiny_spec
from .corpus import varied_requests
from .deciding import prepare, respond, systemone
from .serverkit import RunningServer, registry_for
from .strictcupy import StrictCuPy
from .test_worker import run_worker

pytestmark = pytest.mark.integration

TOLERANCE = 1e-5  # the stand-in computes with numpy: only the order of float32 sums may differ
REQUESTS = [varied_requests()[i] for i in (0, 1, 2, 6, 8, 11, 22)]


def assert_close(got, want, where="response"):
    """Same structure; numbers within TOLERANCE."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            assert_close(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert abs(got - want) <= TOLERANCE, (where, got, want)
    else:
        assert got == want, where


def open_on_device(fx, **keys):
    """The tiny model with head_device = "cuda" on a fresh stand-in (in sys.modules while it loads)."""
    xp = StrictCuPy()
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "cupy", xp)
        return open_spec(tiny_spec(fx, head_device="cuda", **keys)), xp


@pytest.fixture(scope="module")
def on_device(fx):
    model, xp = open_on_device(fx)  # the prefix cache on, as by default
    yield model, xp
    model.close()


def test_the_pipeline_runs_on_the_stand_in_with_one_pinned_upload(fx, tiny_model):
    model, xp = open_on_device(fx, prefix_cache_mb=0)  # each request decoded in one piece
    try:
        assert model.head.xp is xp and type(model.head.params["hidden_norm"]["weight"]) is xp.ndarray
        items = model.prefill_batch([prepare(model, r) for r in REQUESTS])
        for item in items:
            # llama.cpp's rows were copied once, straight into pinned memory (np.split views of it)
            assert xp.is_pinned(item.hidden)
            before = xp.pinned_uploads
            got = model.logits(item.prepared.encoded, item.hidden)
            assert xp.pinned_uploads == before + 1  # the hidden states: one DMA from the pinned rows
            want = tiny_model.logits(item.prepared.encoded, item.hidden)
            assert type(got) is np.ndarray
            np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE)
    finally:
        model.close()


def test_the_pipeline_with_its_prefix_cache_on_the_stand_in(on_device, tiny_model):
    model, _ = on_device
    for request in REQUESTS + REQUESTS:  # the second round reuses cached prefixes (memory rows uploaded)
        assert_close(respond(model, request), respond(tiny_model, request))
    assert model.backbone.prefix_cache is not None


@pytest.mark.parametrize("overlap", [False, True], ids=["inline-head", "pipelined-head"])
def test_the_worker_runs_on_the_stand_in(on_device, tiny_model, overlap):
    model, xp = on_device
    xp.transfer_threads.clear()
    decisions = run_worker(model, REQUESTS, overlap)
    for decision, request in zip(decisions, REQUESTS):
        assert_close(systemone(decision, request), respond(tiny_model, request))
    assert max(d.timings.batch_size for d in decisions) > 1
    head_thread = f"clef-head-{model.name}" if overlap else f"clef-prefill-{model.name}"
    assert xp.transfer_threads == {head_thread}  # the head's uploads and downloads ran in the thread meant to


def test_hidden_states_are_read_after_an_explicit_synchronize(fx, monkeypatch):
    assert callable(llama_cpp.llama_synchronize)  # the binding exists in llama-cpp-python 0.3.36
    calls = []
    sync, read = llama_cpp.llama_synchronize, backbone_module.lc_ext.llama_get_embeddings_nextn
    monkeypatch.setattr(llama_cpp, "llama_synchronize", lambda ctx: (calls.append("sync"), sync(ctx))[1])
    monkeypatch.setattr(backbone_module.lc_ext.load(), "llama_get_embeddings_nextn",
                        lambda ctx: (calls.append("read"), read(ctx))[1])
    given = []

    def rows(n, width):  # a host_rows allocator that remembers what it handed out
        given.append(np.empty((n, width), np.float32))
        return given[-1]

    with backbone_module.Backbone(fx.gguf_f32, backbone_module.BackboneOptions(n_ctx=512, n_seq_max=2),
                                  rows) as backbone:
        hidden = backbone.prefill_many([np.array([5, 6, 7, 8]), np.array([9, 10])])
        plain = backbone_module.Backbone(fx.gguf_f32, backbone_module.BackboneOptions(n_ctx=512, n_seq_max=2))
        with plain:
            want = plain.prefill_many([np.array([5, 6, 7, 8]), np.array([9, 10])])
    assert calls[:2] == ["sync", "read"] and calls.count("sync") == calls.count("read")
    assert [h.shape[0] for h in hidden] == [4, 2] and all(np.shares_memory(h, given[0]) for h in hidden)
    for h, w in zip(hidden, want):
        np.testing.assert_array_equal(h, w)


def test_cupy_out_of_memory_is_a_503_the_pool_is_released_and_the_next_request_is_fine(fx, tmp_path, monkeypatch):
    xp = StrictCuPy()
    monkeypatch.setitem(sys.modules, "cupy", xp)
    pool = xp.get_default_memory_pool()
    small = {"model": "tiny", "state": "short", "questions": {"ok": {"type": "noul"}}}
    big = {"model": "tiny", "state": "a long story about the invoices. " * 60, "questions": {
        "pick": {"type": "choice", "criteria": {f"route-{i}": f"the route number {i}" for i in range(40)}}}}
    with RunningServer(registry_for(tiny_spec(fx, head_device="cuda"), tmp_path / "models.toml")) as server:
        peaks = {}
        for name, body in (("small", small), ("big", big)):
            pool.peak = pool.used_bytes()
            assert server.post(body).status == 200
            peaks[name] = pool.peak
        assert peaks["big"] > 1.5 * peaks["small"]
        weights = pool.used_bytes()
        pool.set_limit(size=(peaks["small"] + peaks["big"]) // 2)
        frees, syncs = pool.frees, xp.synchronizations
        reply = server.post({**big, "state": big["state"] + "!"})  # not an answer the server holds
        assert reply.status == 503 and reply.headers["retry-after"] == "1"
        detail = reply.json()["detail"]
        assert detail["error_type"] == "out_of_memory" and "retry shortly" in detail["message"]
        assert xp.synchronizations == syncs + 1  # nothing in flight reads the failed request's pinned rows
        assert pool.frees == frees + 1  # the pool's blocks went back to the driver...
        assert pool.total_bytes() == pool.used_bytes() == weights  # ...all of them: only the head's weights stay
        assert server.post({**small, "state": "short again"}).status == 200  # the next request is fine
        pool.set_limit(size=0)
        assert server.post({**big, "state": big["state"] + "?"}).status == 200


OTHER_PROCESS = 300 << 20  # what another process holds on every fake GPU


class FakeNVML(types.ModuleType):
    """pynvml over fake GPUs; one of them's used memory follows a stand-in's pool (what CuPy holds)."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[tuple[str, str, int]], pool=None, pool_on: int = 0):
        super().__init__("pynvml")
        self.gpus, self.pool, self.pool_on, self.reads = gpus, pool, pool_on, []

    def nvmlInit(self): pass  # noqa: E704, N802

    def nvmlShutdown(self): pass  # noqa: E704, N802

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        if not 0 <= i < len(self.gpus):
            raise self.NVMLError("Invalid Argument")
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):  # noqa: N802
        return next((i for i, g in enumerate(self.gpus) if g[0] == uuid), None) or self._missing(uuid)

    def _missing(self, uuid):
        raise self.NVMLError(f"Not Found: {uuid}")

    def nvmlDeviceGetUUID(self, i):  # noqa: N802
        return self.gpus[i][0]

    def nvmlDeviceGetName(self, i):  # noqa: N802
        return self.gpus[i][1].encode()

    def nvmlDeviceGetMemoryInfo(self, i):  # noqa: N802
        self.reads.append(i)
        total = self.gpus[i][2]
        used = OTHER_PROCESS
        if self.pool is not None and i == self.pool_on:
            used += self.pool.total_bytes()  # what CuPy's pool holds, cached blocks included
        return types.SimpleNamespace(total=total, used=used, free=total - used)


GPUS = [("GPU-aaaa1111", "Card A", 8 << 30), ("GPU-bbbb2222", "Card B", 16 << 30), ("GPU-cccc3333", "Card C", 24 << 30)]


@pytest.mark.parametrize("value, want", [(None, 0), ("1", 1), ("2,0", 2), (" 0 , 1", 0), ("GPU-bbbb", "GPU-bbbb"),
                                         ("MIG-1c2d", "MIG-1c2d"), ("", None), ("-1", None)])
def test_the_visible_device_is_the_first_cuda_visible_devices_names(value, want):
    assert visible_device({} if value is None else {"CUDA_VISIBLE_DEVICES": value}) == want


@pytest.mark.parametrize("value, card", [(None, "Card A"), ("1", "Card B"), ("2,0", "Card C"),
                                         ("GPU-bbbb2222", "Card B"), ("GPU-cccc", "Card C"), ("", None), ("7", None)])
def test_nvml_reads_the_gpu_the_cuda_runtime_uses(monkeypatch, value, card):
    nvml = FakeNVML(GPUS)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpu = read_gpu({} if value is None else {"CUDA_VISIBLE_DEVICES": value})
    if card is None:
        assert gpu is None  # no GPU visible, or NVML does not know it: said by the caller as "no NVML"
        return
    i = [g[1] for g in GPUS].index(card)
    assert card in gpu.device and gpu.total_bytes == GPUS[i][2] and gpu.free_bytes == GPUS[i][2] - (300 << 20)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_serve_counts_the_head_once_and_plans_as_fit_does(fx, monkeypatch, capsys, dtype):
    xp = StrictCuPy()
    pool = xp.get_default_memory_pool()
    nvml = FakeNVML(GPUS, pool, pool_on=1)
    monkeypatch.setitem(sys.modules, "cupy", xp)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)  # a CUDA build, as far as plans go
    plans = []
    real_plan = fit.plan
    monkeypatch.setattr(fit, "plan", lambda *a, **k: plans.append(real_plan(*a, **k)) or plans[-1])
    keys = dict(n_ctx=4096, max_length=4096, n_seq_max=2, n_ubatch=256)
    spec = tiny_spec(fx, head_device="cuda", head_dtype=dtype, n_gpu_layers="auto", **keys)
    head_bytes = stored_bytes(load_config(config_path_for(fx.head)), dtype)

    assert main(["fit", str(fx.gguf_f32), "--head", str(fx.head), "--head-on-gpu", "--head-dtype", dtype, "--ctx",
                 "4096", "--parallel", "2", "--ubatch", "256", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["device"] == "GPU 1 (Card B)" and printed["head_bytes"] == head_bytes
    fit_plan = plans.pop()

    leftover = xp.zeros((1 << 20,), np.float32)  # 4 MiB an earlier request left in the pool's cache
    del leftover
    assert pool.total_bytes() == 4 << 20
    model = open_spec(spec)
    try:
        serve_plan = plans[0]
        assert nvml.reads[0] == 1  # CUDA_VISIBLE_DEVICES's first GPU
        # read with the cache released and before the head was uploaded: the head is counted once
        assert serve_plan.vram_bytes == GPUS[1][2] - (300 << 20) == fit_plan.vram_bytes
        assert serve_plan.head_bytes == head_bytes == pool.used_bytes()  # what the plan counts is what is there
        assert serve_plan == fit_plan  # fit and serve: one plan
        assert model.backbone.options.n_gpu_layers == fit_plan.n_gpu_layers
    finally:
        model.close()


def test_head_dtype_f16_needs_the_gpu(fx):
    with pytest.raises(RegistryError, match='head_dtype: "f16" needs head_device = "cuda"') as info:
        tiny_spec(fx, head_device="cpu", head_dtype="f16")
    assert "2x slower" in str(info.value)
    with pytest.MonkeyPatch.context() as mp:  # "auto" takes f16 and refuses it at load where it finds no GPU
        mp.setitem(sys.modules, "cupy", None)
        with pytest.raises(HeadConfigError, match="head_device \"auto\" found no CuPy with a CUDA device"):
            open_spec(tiny_spec(fx, head_dtype="f16"))
    with pytest.raises(RegistryError, match="must be one of"):
        tiny_spec(fx, head_device="cuda", head_dtype="bf16")
    assert tiny_spec(fx, head_device="cuda", head_dtype="f16").head_dtype == "f16"
    # the earlier spelling reads as the same name
    assert tiny_spec(fx, head_device="cuda", head_dtype="float16").head_dtype == "f16"


def test_host_rows_are_pinned_only_for_a_device_head():
    xp = StrictCuPy()
    rows = host_rows_for(xp)(3, 8)
    assert rows.shape == (3, 8) and rows.dtype == np.float32 and xp.is_pinned(rows)
    assert not xp.is_pinned(host_rows_for(np)(3, 8))


def test_head_device_auto_runs_the_head_where_cupy_finds_a_cuda_device(fx):
    """Issue 52: the default puts the head on the GPU when CuPy and a CUDA device are there, else on the CPU."""
    assert tiny_spec(fx).head_device == "auto"
    xp = StrictCuPy()
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "cupy", xp)
        model = open_spec(tiny_spec(fx, prefix_cache_mb=0))
    try:
        assert model.head.xp is xp and xp.uploads > 0
    finally:
        model.close()
    no_driver = StrictCuPy()

    def fails() -> int:
        raise no_driver.cuda.runtime.CUDARuntimeError("cudaErrorNoDevice")

    no_driver.cuda.runtime.getDeviceCount = fails
    for stand_in in (None, no_driver):  # no CuPy; CuPy without a device
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(sys.modules, "cupy", stand_in)
            model = open_spec(tiny_spec(fx, prefix_cache_mb=0))
        try:
            assert model.head.xp is np
        finally:
            model.close()
