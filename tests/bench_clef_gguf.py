"""Throughput and peak memory of clef GGUF conversions on a synthetic file of a gigabyte or more.

    python -m tests.bench_clef_gguf DIR [--gib 1.2]

Builds in DIR a random qwen35-shaped backbone (F16 matrices of 4096 x 12288 filled from random bytes),
a random head of Clef-flash's size (121.8M parameters, bf16 safetensors) and joins them into a clef
GGUF (head matrices Q8_0). Then each operation runs in a fresh process: join, to_backbone (through
ensure_backbone, as the server does), split (bf16 head), and as the baseline a plain copy of the clef
file (shutil.copyfile). Prints MB/s written, the ratio to the copy, and the peak RSS of each process
next to that of a process that only imports the modules. Remove DIR afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

OPS = ("import", "copy", "join", "convert", "split")
MATRIX = (12288, 4096)  # numpy shape of one F16 matrix: 100.7 MB


def _build(folder: Path, gib: float) -> None:
    from clef_bridge.bridge.demo.builtins import make_demo
    from clef_bridge.bridge.gguf.clef_split import join
    from clef_bridge.bridge.gguf.reader import read_gguf, read_raw
    from clef_bridge.bridge.gguf.writer import CopyFrom, OutTensor, encode_value, write_gguf
    from clef_bridge.head.config import CONFIG_NAME
    from clef_bridge.head.weights import save_state_dict

    from .randomhead import CLEF_FLASH_HEAD, random_state_dict

    folder.mkdir(parents=True, exist_ok=True)
    n_bytes = MATRIX[0] * MATRIX[1] * 2
    count = max(1, round(gib * 2**30 / n_bytes))
    blob = folder / "blob.bin"
    rng = np.random.default_rng(0)
    with blob.open("wb") as f:
        for _ in range(count):
            f.write(rng.integers(0, 2**16, size=MATRIX, dtype=np.uint16).tobytes())
    demo = read_gguf(make_demo(folder / "demo").gguf)  # a qwen35 key set with its tokenizer
    dims = {"qwen35.embedding_length": CLEF_FLASH_HEAD.hidden_size, "qwen35.block_count": count}
    kvs = [(k, encode_value(4, dims[k]) if k in dims else read_raw(demo, k)) for k in demo.fields
           if k not in ("qwen35.attention.recurrent_layers", "qwen35.full_attention_interval")]
    tensors = [OutTensor(f"blk.{i}.ffn_up.weight", MATRIX[::-1], 1, n_bytes, CopyFrom(blob, i * n_bytes))
               for i in range(count)]
    write_gguf(folder / "backbone.gguf", kvs, tensors, progress=False)
    blob.unlink()
    head = folder / "head" / "joint_head.safetensors"
    head.parent.mkdir(exist_ok=True)
    save_state_dict(head, random_state_dict(CLEF_FLASH_HEAD, 0), "BF16")
    (head.parent / CONFIG_NAME).write_text(json.dumps(vars(CLEF_FLASH_HEAD)))
    join(folder / "backbone.gguf", head, folder / "model.clef.gguf", "q8_0", progress=False)


def _run(op: str, folder: Path) -> dict:
    from clef_bridge.bridge.gguf.clef_split import ensure_backbone, join, split

    clef = folder / "model.clef.gguf"
    start = time.monotonic()
    if op == "copy":  # what the kernel does for a plain copy, flushed to disk as our writer does
        shutil.copyfile(clef, folder / "copy.gguf")
        with (folder / "copy.gguf").open("rb") as f:
            os.fsync(f.fileno())
        written = (folder / "copy.gguf").stat().st_size
    elif op == "join":
        written = join(folder / "backbone.gguf", folder / "head" / "joint_head.safetensors", folder / "joined.gguf",
                       "q8_0", progress=False).bytes
    elif op == "convert":
        written = ensure_backbone(clef, folder / "cache", progress=False)[1].bytes
    elif op == "split":
        written = split(clef, folder / "split", "bf16", progress=False).bytes
    else:
        written = 0
    seconds = time.monotonic() - start
    # VmHWM, not getrusage: ru_maxrss carries the parent's resident size over fork and exec
    hwm = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM"))
    return {"op": op, "bytes": written, "seconds": seconds, "peak_rss_mb": int(hwm.split()[1]) / 1024}


def _cleanup(folder: Path) -> None:
    for name in ("copy.gguf", "joined.gguf", "cache", "split"):
        path = folder / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="scratch folder for the synthetic files (several GB)")
    parser.add_argument("--gib", type=float, default=1.2, help="size of the synthetic backbone in GiB")
    parser.add_argument("--op", choices=OPS + ("build",), help=argparse.SUPPRESS)  # one measurement, in a child process
    args = parser.parse_args(argv)
    if args.op == "build":
        _build(args.dir, args.gib)
        return 0
    if args.op:
        print(json.dumps(_run(args.op, args.dir)))
        return 0
    if not (args.dir / "model.clef.gguf").is_file():  # built in a child, so its memory is not in the numbers
        subprocess.run([sys.executable, "-m", "tests.bench_clef_gguf", str(args.dir), "--gib", str(args.gib),
                        "--op", "build"], check=True)
    print(f"clef GGUF: {(args.dir / 'model.clef.gguf').stat().st_size / 1e6:.0f} MB (source in the page cache)")
    rows = []
    for op in OPS:
        out = subprocess.run([sys.executable, "-m", "tests.bench_clef_gguf", str(args.dir), "--op", op],
                             check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out))
        _cleanup(args.dir)
    base = rows[1]["bytes"] / rows[1]["seconds"]
    print(f"{'operation':<10} {'written MB':>10} {'seconds':>8} {'MB/s':>8} {'vs copy':>8} {'peak RSS MB':>12}")
    for r in rows:
        rate = r["bytes"] / r["seconds"] if r["bytes"] else 0
        print(f"{r['op']:<10} {r['bytes'] / 1e6:>10.0f} {r['seconds']:>8.2f} {rate / 1e6:>8.0f} "
              f"{rate / base if rate else 0:>8.2f} {r['peak_rss_mb']:>12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
