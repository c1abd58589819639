"""Converting between clef GGUFs and backbone + head: round trips, llama.cpp on the converted backbone,
the backbone cache, MTP layers dropped, and what an interrupted or space-starved write leaves behind."""

from __future__ import annotations

import fcntl
import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import namedtuple

import numpy as np
import pytest
from clef_bridge.bridge.demo.builtins import make_demo
from clef_bridge.bridge.gguf import writer as gguf_write
from clef_bridge.bridge.gguf.clef_head import read_embedded_head
from clef_bridge.bridge.gguf.clef_split import ConvertError, ensure_backbone, join, split
from clef_bridge.bridge.gguf.reader import read_gguf
from clef_bridge.bridge.gguf.writer import NotEnoughDisk, remove_stale
from clef_bridge.bridge.llama.backbone import Backbone, BackboneError, BackboneOptions
from clef_bridge.head.config import HeadConfig, config_path_for
from clef_bridge.head.weights import load_state_dict
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from . import fixturegen_clef
from .fixturegen import ROOT, TINY_HEAD
from .test_clef_format import SCALAR_RTOL, SCALARS

pytestmark = pytest.mark.integration

CFG = HeadConfig(**TINY_HEAD)
TOKENS = (np.arange(1, 180) * 7919 % 150000).astype(np.int32)


@pytest.fixture(scope="module")
def clef_fx(fx):
    return fixturegen_clef.build(fx)


def _hidden(path) -> np.ndarray:
    with Backbone(path, BackboneOptions(n_ctx=512, n_seq_max=1, n_gpu_layers=0)) as bb:
        return bb.prefill(TOKENS)


# --- round trips --------------------------------------------------------------------------------------

@pytest.mark.parametrize("backbone, head_type, split_dtype, want_dtype, atol", [
    ("gguf_f32", "f32", None, "F32", 0.0),  # an F32 head splits to F32 unless asked otherwise
    ("gguf_q8_0", "bf16", None, "BF16", 0.0),  # the fixture head is bf16: bf16 holds it exactly
    ("gguf_f32", "f16", "f32", "F32", 2.0 ** -25),  # f16 rounds only below its normal range (2^-14)
    ("gguf_q8_0", "q8_0", None, "BF16", 4e-3),  # q8_0: half a step of max|x| / 127 per block of 32
])
def test_join_then_split_gives_back_backbone_and_head(tmp_path, fx, backbone, head_type, split_dtype, want_dtype,
                                                      atol):
    source = getattr(fx, backbone)
    joined = join(source, fx.head, tmp_path / "model.gguf", head_type)
    out = split(joined.path, tmp_path / "release", split_dtype)
    assert out.backbone.name == "model.backbone.gguf" and out.head_dtype == want_dtype
    # the backbone comes back bit for bit: same keys with the same types, every tensor's bytes
    a, b = read_gguf(out.backbone), read_gguf(source)
    assert [(k, f.type, f.element_type) for k, f in a.fields.items()] == \
        [(k, f.type, f.element_type) for k, f in b.fields.items()]
    assert a.tensors.keys() == b.tensors.keys()
    assert filecmp.cmp(out.backbone, source, shallow=False)
    assert json.loads(out.config.read_text()) == json.loads(config_path_for(fx.head).read_text())
    got, want = load_state_dict(out.head, CFG), load_state_dict(fx.head, CFG)
    for name in want:
        rtol = SCALAR_RTOL if name in SCALARS else 0.0
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


def test_split_and_join_refuse_what_they_cannot_do(tmp_path, fx, clef_fx):
    with pytest.raises(ConvertError, match="split takes a clef GGUF"):
        split(fx.gguf_f32, tmp_path / "x")
    with pytest.raises(ConvertError, match="qwen35 backbone"):
        join(clef_fx.f32, fx.head, tmp_path / "y.gguf")
    demo = make_demo(tmp_path / "demo")  # hidden 128: not the tiny head's 64
    with pytest.raises(ConvertError, match="hidden_size 64"):
        join(demo.gguf, fx.head, tmp_path / "z.gguf")
    with pytest.raises(ConvertError, match="bucket"):
        join(fx.gguf_f32, fx.head, tmp_path / "t.gguf", temperatures={"choice.4": 0.9})
    with pytest.raises(ConvertError, match="> 0"):
        join(fx.gguf_f32, fx.head, tmp_path / "t.gguf", temperatures={"choice": 0.0})
    (tmp_path / "taken.gguf").write_bytes(b"mine")
    with pytest.raises(ConvertError, match="already exist"):
        join(fx.gguf_f32, fx.head, tmp_path / "taken.gguf")
    assert (tmp_path / "taken.gguf").read_bytes() == b"mine"
    assert not list(tmp_path.glob(".*.partial"))


def test_temperatures_reach_the_gguf_and_come_back(tmp_path, fx):
    temps = {"choice": 0.8, "score.6_10": 1.25, "noul.2": 2.0}
    joined = join(fx.gguf_f32, fx.head, tmp_path / "t.gguf", temperatures=temps)
    assert read_embedded_head(joined.path).temperatures == pytest.approx(temps)
    assert split(joined.path, tmp_path / "out").temperatures == pytest.approx(temps)


def _with_mtp_layer(src, out):
    """src plus an MTP block as upstream's converter writes one (block_count + 1, nextn tensors)."""
    reader = GGUFReader(src)
    writer = GGUFWriter(out, "qwen35")
    n = int(reader.fields["qwen35.block_count"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value, sub = field.contents(), (field.types[1] if len(field.types) > 1 else None)
        value = n + 1 if key == "qwen35.block_count" else value + [False] if key.endswith("recurrent_layers") \
            else value
        writer.add_key_value(key, value, field.types[0], sub)
    writer.add_key_value("qwen35.nextn_predict_layers", 1, GGUFValueType.UINT32)
    tensors = {t.name: t for t in reader.tensors}
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    last = [t for name, t in tensors.items() if name.startswith(f"blk.{n - 1}.")]
    for t in last:
        writer.add_tensor(t.name.replace(f"blk.{n - 1}.", f"blk.{n}."), t.data, raw_shape=t.data.shape,
                          raw_dtype=t.tensor_type)
    h = int(reader.fields["qwen35.embedding_length"].contents())
    for name, shape in (("eh_proj.weight", (h, 2 * h)), ("enorm.weight", (h,)), ("hnorm.weight", (h,)),
                        ("shared_head_norm.weight", (h,))):
        writer.add_tensor(f"blk.{n}.nextn.{name}", np.ones(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_join_drops_the_mtp_block(tmp_path):
    demo = make_demo(tmp_path / "demo")
    _with_mtp_layer(demo.gguf, tmp_path / "mtp.gguf")
    joined = join(tmp_path / "mtp.gguf", demo.head, tmp_path / "clef.gguf")
    assert "qwen35.nextn_predict_layers" in joined.dropped and "blk.4.nextn.eh_proj.weight" in joined.dropped
    info = read_gguf(joined.path)
    assert info.metadata["clef.block_count"] == 4 and len(info.metadata["clef.attention.recurrent_layers"]) == 4
    assert not [k for k in info.fields if "nextn" in k] and not [t for t in info.tensors if t.startswith("blk.4.")]
    back = split(joined.path, tmp_path / "out")
    assert filecmp.cmp(back.backbone, demo.gguf, shallow=False)  # exactly the backbone without its MTP block


# --- llama.cpp on the converted backbone ------------------------------------------------------------

@pytest.mark.parametrize("which, original", [("f32", "gguf_f32"), ("q8_0", "gguf_q8_0")])
def test_converted_backbone_gives_identical_hidden_states(tmp_path, fx, clef_fx, which, original):
    clef = getattr(clef_fx, which)  # written by gguf-py, not by us
    with pytest.raises(BackboneError):
        Backbone(clef, BackboneOptions(n_ctx=512, n_seq_max=1, n_gpu_layers=0))  # why the conversion exists
    path, done = ensure_backbone(clef, tmp_path / "cache", progress=False)
    assert done.action == "converted" and done.bytes == path.stat().st_size
    ours, theirs = _hidden(path), _hidden(getattr(fx, original))
    assert np.abs(theirs).max() > 0.1
    assert np.array_equal(ours, theirs)


def test_the_cache_reuses_and_notices_a_changed_source(tmp_path, clef_fx):
    clef = tmp_path / "model.gguf"
    shutil.copy(clef_fx.f32, clef)
    first, done = ensure_backbone(clef, tmp_path / "cache", progress=False)
    assert done.action == "converted"
    again, done = ensure_backbone(clef, tmp_path / "cache", progress=False)
    assert (again, done.action) == (first, "reused")
    st = clef.stat()
    os.utime(clef, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new download of the same name
    third, done = ensure_backbone(clef, tmp_path / "cache", progress=False)
    assert done.action == "converted" and third != first and done.superseded == (first,)
    assert sorted(p.name for p in (tmp_path / "cache").glob("*.gguf")) == [third.name]


# --- interrupted and space-starved writes -----------------------------------------------------------

SLOW_CONVERT = """
import sys, time
from clef_bridge.bridge.gguf import writer as gguf_write
from clef_bridge.bridge.gguf.clef_split import ensure_backbone
gguf_write.CHUNK = 1 << 20
def slowly(done, total):
    if done > 4 << 20:
        print("copying", flush=True)
    time.sleep(0.05)
ensure_backbone(sys.argv[1], sys.argv[2], progress=False, on_chunk=slowly)
print("finished", flush=True)
"""


def _start_and_stop(clef, cache, sig) -> int:
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CONVERT, str(clef), str(cache)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "copying"
    assert list(cache.glob(".*.partial")), "the conversion writes under a temporary name"
    proc.send_signal(sig)
    proc.wait(timeout=60)
    return proc.returncode


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_conversion_leaves_nothing(tmp_path, clef_fx, sig):
    cache = tmp_path / "cache"
    assert _start_and_stop(clef_fx.f32, cache, sig) != 0
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == []


def test_a_killed_conversion_is_cleaned_up_and_redone(tmp_path, clef_fx):
    cache = tmp_path / "cache"
    assert _start_and_stop(clef_fx.f32, cache, signal.SIGKILL) == -signal.SIGKILL
    stale = list(cache.glob(".*.partial"))
    assert len(stale) == 1 and not list(cache.glob("*.gguf"))  # never at the final name
    path, done = ensure_backbone(clef_fx.f32, cache, progress=False)
    assert done.action == "converted" and not stale[0].exists()
    assert path.stat().st_size == done.bytes == read_gguf(path).file_size


def test_a_live_writers_file_is_not_stale(tmp_path):
    out = tmp_path / "x.gguf"
    partial = tmp_path / f".x.gguf.{os.getpid() + 1}.partial"
    with partial.open("wb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        assert remove_stale(out) == [] and partial.exists()
    assert remove_stale(out) == [partial] and not partial.exists()


def test_an_error_mid_copy_leaves_nothing(tmp_path, clef_fx):
    def fail(done, total):
        if done > total // 2:
            raise RuntimeError("disk went away")

    with pytest.raises(RuntimeError, match="disk went away"):
        ensure_backbone(clef_fx.f32, tmp_path / "cache", progress=False, on_chunk=fail)
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


def test_too_little_disk_is_a_clear_error(tmp_path, clef_fx, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(gguf_write.shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 5000, 5000))
    cache = tmp_path / "cache"
    with pytest.raises(NotEnoughDisk) as err:
        ensure_backbone(clef_fx.f32, cache, progress=False)
    needed = read_gguf(clef_fx.f32).file_size
    assert err.value.needed > 0.99 * needed and str(cache) in str(err.value) and str(err.value.needed) in str(err.value)
    assert "5000 bytes" in str(err.value)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_the_copy_through_user_space_writes_the_same_bytes(tmp_path, clef_fx, monkeypatch):
    kernel, _ = ensure_backbone(clef_fx.f32, tmp_path / "a", progress=False)
    calls = []

    def unsupported(*args):
        calls.append(args)
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", unsupported)
    monkeypatch.setattr(gguf_write, "CHUNK", 1 << 20)  # many chunks: the loop's offsets are exercised
    user, _ = ensure_backbone(clef_fx.f32, tmp_path / "b", progress=False)
    assert calls and filecmp.cmp(kernel, user, shallow=False)


def test_join_counts_the_size_label_with_the_head_as_upstreams_converter_does():
    """Issue 54: join copied the backbone's general.size_label ('825K' on a small model) where upstream's converter
    counts the head too ('1.1M'); experts count once per expert (gguf-py's get_total_parameter_count)."""
    from clef_bridge.bridge.gguf.clef_split import parameter_label
    from clef_bridge.bridge.gguf.writer import OutTensor

    def tensor(name: str, *ne: int) -> OutTensor:
        return OutTensor(name, ne, 0, 0, b"")

    backbone = [tensor("token_embd.weight", 64, 10_000), tensor("blk.0.attn_q.weight", 640, 295)]
    head = [tensor("decision.proj_memory.weight", 64, 4_700)]
    assert parameter_label(backbone) == "829K" and parameter_label(backbone + head) == "1.1M"
    moe = [tensor("blk.0.ffn_up_exps.weight", 64, 128, 8), tensor("token_embd.weight", 64, 1000)]
    assert parameter_label(moe) == "8x72K"  # 64,000 shared + 8,192 per expert
