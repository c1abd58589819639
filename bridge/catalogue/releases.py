"""Cloudflare's Clef releases: their names (Workers AI's and `pull`'s), repositories, widths, the GGUF
architectures each comes as, and the built-in demo that stands in for one."""

from __future__ import annotations

from dataclasses import dataclass

from .architectures import CLEF_ARCHITECTURES, QWEN3VLMOE, QWEN35

HUB_OWNER = "Cloudflare"


@dataclass(frozen=True)
class Release:
    name: str  # Workers AI's model name, and `pull`'s and `fit --arch`'s argument
    width: int  # the backbone's hidden size (the head's too)
    backbone: str  # the architecture llama.cpp's converter writes its backbone as (`fit --arch` plans for it)
    architectures: tuple[str, ...]  # the GGUF architectures `pull` takes for it
    by_architecture: bool = False  # the server gives its name to a model of its architecture, whatever its width
    demo: str = ""  # the built-in model (models.toml builtin) that stands in for it, "" for none

    @property
    def repo(self) -> str:
        """The Hugging Face repository of the release (its safetensors head and config)."""
        return f"{HUB_OWNER}/{self.name}"

    @property
    def pull_command(self) -> str:
        """The `pull` that fetches it, as the banner and the demos' warnings print it: GGUFs come from community
        repositories whose file names vary, so the repository and file are placeholders to fill in (docs/serving.md
        names some); without them `pull` refuses."""
        return f"clef-bridge pull {self.name} --gguf-repo OWNER/REPO --gguf-file NAME.gguf"


# pull has always taken any Clef architecture for the Qwen3.5 releases (the head's width check refuses a wrong one)
CLEF_FLASH = Release("clef-flash", 4096, QWEN35.name, CLEF_ARCHITECTURES, demo="demo")
CLEF_27B = Release("clef", 5120, QWEN35.name, CLEF_ARCHITECTURES)
CLEF_OMNI = Release("clef-omni", 2048, QWEN3VLMOE.name, (QWEN3VLMOE.name,), by_architecture=True, demo="demo-omni")
RELEASES = {r.name: r for r in (CLEF_FLASH, CLEF_27B, CLEF_OMNI)}

# Workers AI's names of the releases named by width (the server gives each to a model of that width)
CLOUDFLARE_NAMES = {r.width: r.name for r in RELEASES.values() if not r.by_architecture}
# the release named by its architecture (Clef-omni: the tests' tiny random one is 64 wide)
NAMED_BY_ARCHITECTURE = {r.backbone: r.name for r in RELEASES.values() if r.by_architecture}
REAL_RELEASES = {r.demo: r.name for r in RELEASES.values() if r.demo}  # what to pull instead of each demo
