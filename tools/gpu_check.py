"""GPU path check: a random Qwen3.5-shaped backbone with a Clef-flash-shaped head, served on the GPU,
answers compared with the CPU, and p50 latency for a ~750-token request with the head on CuPy and on
numpy. Run through tools/gpu_check.sh on a CUDA machine; `--smoke` runs the same logic on the CPU
with small shapes (what the tests can do without a GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ..bridge.demo import DEMO_HEAD, Qwen35Dims, write_qwen35_gguf
from ..bridge.loading import load_checked
from ..bridge.registry import model_spec, with_keys
from ..head.config import CONFIG_NAME, HeadConfig
from ..head.weights import save_state_dict
from .bench import median_ms, router_request
from .randomhead import CLEF_FLASH_HEAD, random_state_dict

# Answers of the GPU path may differ from the CPU path by accumulation order and flash attention's
# f16 rounding; probabilities within 5e-3 (the rounding step of answers is 1e-4).
TOLERANCE = 5e-3
WIDE = Qwen35Dims(hidden=4096, layers=8, ff=12288, heads=16, kv_heads=4, head_dim=256, linear_k_heads=16,
                  linear_v_heads=32, linear_k_dim=128, linear_v_dim=128)


def _max_diff(a: dict, b: dict) -> float:
    worst = 0.0
    for qid, answer in a["answers"].items():
        other = b["answers"][qid]
        if answer["type"] == "noul":
            worst = max(worst, abs(answer["noul"] - other["noul"]))
        else:
            worst = max(worst, max(abs(v - other["probabilities"][k]) for k, v in answer["probabilities"].items()))
    return worst


def run(folder: Path, smoke: bool, repeats: int) -> dict:
    dims, head_cfg = (Qwen35Dims(), DEMO_HEAD) if smoke else (WIDE, CLEF_FLASH_HEAD)
    gguf = folder / "backbone.gguf"
    head = folder / "joint_head.safetensors"
    write_qwen35_gguf(gguf, dims, seed=0, name="gpu check", matrices="F32" if smoke else "F16")
    save_state_dict(head, random_state_dict(HeadConfig(**vars(head_cfg)), seed=0), "BF16")
    (folder / CONFIG_NAME).write_text(json.dumps(vars(head_cfg)))
    base = model_spec("check", gguf, head, n_ctx=4096, max_length=4096)
    gpu_layers = 0 if smoke else -1
    device = "cpu" if smoke else "cuda"
    body = router_request(sentences=6 if not smoke else 3)
    requests = [body, {**body, "state": "short"}, {**body, "questions": dict(list(body["questions"].items())[:2])}]
    cpu = load_checked(with_keys(base, n_gpu_layers=0)).model
    reference = [cpu.decide(r) for r in requests]
    cpu.close()
    out = {"shape": "smoke" if smoke else "clef-flash head, hidden-4096 backbone"}
    first = "head on numpy (smoke)" if smoke else "head on cupy"
    for label, head_device in ((first, device), ("head on numpy", "cpu")):
        model = load_checked(with_keys(base, n_gpu_layers=gpu_layers, head_device=head_device)).model
        try:
            diff = max(_max_diff(model.decide(r), ref) for r, ref in zip(requests, reference))
            tokens = len(model.prepare(body).encoded.input_ids)
            p50 = median_ms(lambda: model.decide(body), repeats)
            out[label] = {"max_abs_diff_vs_cpu": round(diff, 6), "p50_ms": round(p50, 2),
                          "tokens": tokens, "within_tolerance": diff <= TOLERANCE}
        finally:
            model.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small shapes on the CPU: the logic without a GPU")
    parser.add_argument("--repeats", type=int, default=9, help="timed requests per configuration (default: 9)")
    parser.add_argument("--folder", type=Path, help="where to write the random model (default: a temporary folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        result = run(folder, args.smoke, args.repeats)
    print(json.dumps(result, indent=2))
    ok = all(v["within_tolerance"] for v in result.values() if isinstance(v, dict))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
