"""The head on the strict CuPy stand-in (tests/strictcupy.py): it runs with device arrays end to
end, equals the numpy head, reads nothing back to the host, and any host/device mixing fails.
The GPU run itself is tools/gpu_check.sh."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.head.config import HeadConfig
from clef_bridge.head.errors import HeadConfigError, HeadWeightsError
from clef_bridge.head.model import array_module, joint_schema_head
from clef_bridge.head.weights import (
    load_state_dict,
    params_from,
    save_state_dict,
    store_matrices,
    stored_bytes,
    unflatten,
)

from .randomhead import CLEF_FLASH_HEAD, random_inputs, random_layout, random_state_dict
from .strictcupy import IMPLICIT, StrictCuPy

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # the stand-in computes with numpy: only the order of float32 sums may differ
TINY = HeadConfig(hidden_size=64, width=32, routing_layers=1, layers=1, heads=2, feedforward=64)


def load_params(path, cfg: HeadConfig, xp=np, dtype: str = "f32"):
    """The head's parameters from its file, on xp, as loading reads them (its strict reader, then params_from)."""
    return params_from(load_state_dict(path, cfg), xp, dtype, path)


def device_params(xp, flat):
    return unflatten({k: xp.asarray(v) for k, v in flat.items()})


@pytest.fixture(scope="module")
def tiny_head(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "joint_head.safetensors"
    save_state_dict(path, random_state_dict(TINY, seed=3), "BF16")
    return path


@pytest.mark.parametrize("cfg, tokens, types, options", [
    (TINY, 300, [0, 1, 2], [2, 6, 4]),
    (CLEF_FLASH_HEAD, 760, [0, 1, 2, 1], [2, 7, 5, 5]),
    (CLEF_FLASH_HEAD, 3200, [1, 0], [200, 2]),  # many options: attention takes its direct form
], ids=["tiny", "clef-flash", "clef-flash-many-options"])
def test_head_on_the_stand_in_equals_numpy(cfg, tokens, types, options):
    flat = random_state_dict(cfg, seed=3)
    layout = random_layout(tokens, types, options, seed=4)
    hidden, _, _, rows = random_inputs(cfg, layout, tokens, seed=6)
    want = joint_schema_head(hidden, rows, layout, cfg.heads, **unflatten(flat))

    xp = StrictCuPy()
    params = device_params(xp, flat)
    d_hidden, d_rows = xp.asarray(hidden), xp.asarray(rows)
    got = joint_schema_head(d_hidden, d_rows, layout, cfg.heads, **params)
    assert type(got) is xp.ndarray  # it stayed on the device
    assert xp.downloads == 0  # the head never reads back to the host (each read would be a GPU sync)
    np.testing.assert_allclose(xp.asnumpy(got), want, rtol=0, atol=TOLERANCE)
    assert np.abs(want).max() > 0.1


def test_loaded_params_live_on_the_device(tiny_head):
    xp = StrictCuPy()
    params = load_params(tiny_head, TINY, xp)
    assert type(params["layers"][0]["self_attn"]["in_proj_weight"]) is xp.ndarray
    assert array_module(params["hidden_norm"]["weight"]) is xp
    assert xp.uploads == len(random_state_dict(TINY, seed=3))  # one upload per tensor, once
    assert xp.get_default_memory_pool().used_bytes() >= sum(v.nbytes for v in random_state_dict(TINY).values())


def test_array_module_follows_the_arrays_own_module():
    xp = StrictCuPy()
    assert array_module(np.zeros(2)) is np and array_module(np.float32(1)) is np
    assert array_module(xp.zeros(2)) is xp and array_module(xp.zeros(2).sum()) is xp


# Mixing the stand-in refuses, as CuPy does; scalars it allows, as CuPy does.
MIXED = {
    "np.asarray(device)": lambda d, h: np.asarray(d),
    "device + host": lambda d, h: d + h,
    "host * device": lambda d, h: h * d,
    "device @ host": lambda d, h: d @ h.T,
    "np.matmul(host, device)": lambda d, h: np.matmul(h, d.T),
    "in place: device += host": lambda d, h: d.__iadd__(h),
    "np.stack([device, host])": lambda d, h: np.stack([d, h]),
    "np.where(host > 0, device, 0)": lambda d, h: np.where(h > 0, d, 0),
    "host + device.sum()": lambda d, h: h + d.sum(),
    "device[host index]": lambda d, h: d[np.array([0, 1])],
    "device op on a host list": lambda d, h: d.__array_namespace__().exp([1.0, 2.0]),
}
ALLOWED = {
    "device * numpy scalar": lambda d: d * np.float32(0.5),
    "numpy scalar * device": lambda d: np.float32(0.5) * d,
    "python scalars": lambda d: 1.0 - 2 * d / 3.0,
    "numpy ufunc on a device array": lambda d: np.exp(d),
    "numpy function on device arrays": lambda d: np.stack([d, d]),
    "device index": lambda d: d[d.__array_namespace__().asarray(np.array([1, 0]))],
}


@pytest.mark.parametrize("name", list(MIXED))
def test_the_stand_in_refuses_host_device_mixing(name):
    xp = StrictCuPy()
    d = xp.asarray(np.ones((2, 3), np.float32))
    with pytest.raises(TypeError):
        MIXED[name](d, np.ones((2, 3), np.float32))


@pytest.mark.parametrize("name", list(ALLOWED))
def test_the_stand_in_allows_what_cupy_allows(name):
    xp = StrictCuPy()
    d = xp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    out = ALLOWED[name](d)
    assert type(out) is xp.ndarray and out.dtype == np.float32


def test_the_stand_in_catches_a_head_that_mixes(tiny_head):
    """A host array where the head expects device ones fails at once, as it would on a GPU."""
    xp = StrictCuPy()
    params = load_params(tiny_head, TINY, xp)
    layout = random_layout(300, [1, 2], [3, 4], seed=1)
    hidden, _, _, rows = random_inputs(TINY, layout, 300, seed=2)
    with pytest.raises(TypeError):
        joint_schema_head(xp.asarray(hidden), rows, layout, TINY.heads, **params)  # rows left on the host
    params["layers"][0]["linear2"]["bias"] = np.zeros(TINY.width, np.float32)  # one weight left on the host
    with pytest.raises(TypeError):
        joint_schema_head(xp.asarray(hidden), xp.asarray(rows), layout, TINY.heads, **params)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(xp.asarray(hidden))
    assert "Implicit conversion" in IMPLICIT


def test_the_stand_in_pool_counts_limits_and_frees():
    xp = StrictCuPy()
    pool = xp.get_default_memory_pool()
    a = xp.zeros((256, 256), np.float32)
    view = a.T[:10]  # views share their base's memory
    assert pool.used_bytes() == a.nbytes
    del a, view
    assert pool.used_bytes() == 0 and pool.total_bytes() == 256 * 256 * 4  # kept, as CuPy's pool keeps blocks
    pool.free_all_blocks()
    assert pool.total_bytes() == 0
    pool.set_limit(size=1 << 20)
    keep = xp.ones((200, 1024), np.float32)  # 800 KiB
    with pytest.raises(xp.cuda.memory.OutOfMemoryError) as raised:
        keep @ xp.ones((1024, 1024), np.float32)
    assert isinstance(raised.value, MemoryError)
    pool.set_limit(size=0)
    assert (keep @ xp.ones((1024, 8), np.float32)).shape == (200, 8)


def test_float16_storage_keeps_vectors_float32_and_stays_close(tiny_head):
    flat = random_state_dict(TINY, seed=3)
    half = store_matrices(flat, "float16")
    for name, value in half.items():
        matrix = value.ndim == 2 and name != "type_embedding.weight"
        assert value.dtype == (np.float16 if matrix else np.float32), name
    assert sum(v.nbytes for v in half.values()) == stored_bytes(TINY, "float16")
    assert sum(v.nbytes for v in flat.values()) == stored_bytes(TINY, "float32")
    # Clef-flash's head (121,762,820 parameters): 487 MB in float32, 244 MB with float16 matrices
    assert stored_bytes(CLEF_FLASH_HEAD, "float32") == 121_762_820 * 4
    assert stored_bytes(CLEF_FLASH_HEAD, "float16") == 243_779_600
    layout = random_layout(300, [0, 1, 2], [2, 6, 4], seed=4)
    hidden, _, _, rows = random_inputs(TINY, layout, 300, seed=6)
    full = joint_schema_head(hidden, rows, layout, TINY.heads, **unflatten(flat))
    xp = StrictCuPy()
    got = joint_schema_head(xp.asarray(hidden), xp.asarray(rows), layout, TINY.heads, **device_params(xp, half))
    got = xp.asnumpy(got)
    assert got.dtype == np.float32  # float16 storage, float32 compute
    assert 0 < np.abs(got - full).max() <= 2e-3  # float16 rounds float32 weights (relative 2^-11): 2.8e-4 here
    # bf16 weights, as Cloudflare ships them, fit float16 exactly: the same logits
    bf16 = load_params(tiny_head, TINY, np, dtype="float16")
    exact = joint_schema_head(hidden, rows, layout, TINY.heads, **load_params(tiny_head, TINY))
    np.testing.assert_allclose(joint_schema_head(hidden, rows, layout, TINY.heads, **bf16), exact, rtol=0, atol=1e-6)


def test_float16_refuses_what_it_cannot_hold():
    flat = random_state_dict(TINY, seed=3)
    flat["memory_projection.weight"][0, 0] = 1e5
    flat["layers.0.linear1.weight"][1, 1] = -7e4
    with pytest.raises(HeadWeightsError) as raised:
        store_matrices(flat, "float16", "joint_head.safetensors")
    assert {p.split(":")[0] for p in raised.value.problems} == {"memory_projection.weight", "layers.0.linear1.weight"}
    assert "head_dtype = \"f32\"" in str(raised.value)
    with pytest.raises(HeadConfigError, match="f32, f16"):
        store_matrices(flat, "bfloat16")


def test_the_stand_in_counts_transfers_and_syncs():
    xp = StrictCuPy()
    pinned = np.frombuffer(xp.cuda.alloc_pinned_memory(6 * 4), np.float32).reshape(2, 3)  # host staging
    pinned[:] = np.arange(6).reshape(2, 3)
    d = xp.asarray(pinned)
    pinned[:] = 0  # the device holds its own copy
    out = np.empty((2, 3), np.float32)
    assert xp.asnumpy(d * 2, out=out) is out and out.tolist() == [[0, 2, 4], [6, 8, 10]]
    assert float(d.sum()) == 15.0  # a read back, counted like any other
    xp.cuda.Device(0).synchronize()
    assert (xp.uploads, xp.upload_bytes, xp.downloads, xp.synchronizations) == (1, 24, 2, 1)
