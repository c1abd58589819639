"""Fine-tune fixtures: random PEFT LoRA checkpoints over the tiny random Qwen3.5, as clef-finetune writes them.

Each checkpoint folder holds `adapter/` (PEFT's `save_pretrained`: adapter_config.json and
adapter_model.safetensors) and `joint_head.safetensors` (float32) beside it, plus the head's
joint_head_config.json (clef-finetune reads that from the release; the bridge wants it beside the head).
Targets are clef-finetune's own (`discover_lora_targets` on the tiny model): every linear of the text
decoder, linear attention included. Every B matrix is non-zero, so every target moves the hidden states.

Run `python -m tests.fixturegen_lora` to build them by hand; the tests build them on first use.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from . import fixturegen
from .fixturegen import FIXTURES, SEED, TINY_HEAD, Fixtures, _lock, _log


@dataclass(frozen=True)
class LoraRecipe:
    name: str
    r: int
    alpha: int
    seed: int
    std: float  # of A's and B's entries: the delta per weight is ~ alpha / r * std^2 * sqrt(r)


# Two fine-tunes of different rank and scale (alpha / r = 2 and 1), so a wrong scale shows.
RECIPES = (LoraRecipe("claims", r=8, alpha=16, seed=SEED + 10, std=0.05),
           LoraRecipe("routing", r=4, alpha=4, seed=SEED + 11, std=0.07))


@dataclass(frozen=True)
class LoraFixtures:
    base: Fixtures
    checkpoints: dict[str, Path]  # name -> checkpoint folder (adapter/ + joint_head.safetensors)

    def adapter(self, name: str) -> Path:
        return self.checkpoints[name] / "adapter"

    def head(self, name: str) -> Path:
        return self.checkpoints[name] / "joint_head.safetensors"

    def merged(self, name: str) -> Path:
        """The fine-tune merged into the base and converted to an F32 GGUF (what serving it whole takes today)."""
        root = self.base.root
        out = root / f"tiny-lora-{name}-merged-f32.gguf"
        with _lock(root):
            if not out.exists():
                _log(f"building {out.name}")
                hf = root / f"tiny-lora-{name}-merged-hf"
                merge(self.base.hf_model, self.adapter(name), hf)
                fixturegen.convert(fixturegen.sdist(root), hf, out.with_suffix(".tmp"), "f32")
                out.with_suffix(".tmp").rename(out)
        return out


def build_checkpoint(hf_model: Path, out: Path, recipe: LoraRecipe) -> None:
    """A clef-finetune checkpoint folder: a random PEFT adapter on every target and a random float32 head."""
    import torch
    from clef_bridge.head.config import HeadConfig
    from clef_bridge.head.weights import save_state_dict
    from clef_finetune.model import DEFAULT_EXCLUDE, discover_lora_targets, targets_regex
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3_5ForConditionalGeneration

    from .randomhead import random_state_dict

    backbone = Qwen3_5ForConditionalGeneration.from_pretrained(hf_model, dtype=torch.float32).eval()
    targets = discover_lora_targets(backbone, exclude_patterns=DEFAULT_EXCLUDE)
    config = LoraConfig(r=recipe.r, lora_alpha=recipe.alpha, lora_dropout=0.0, bias="none",
                        target_modules=targets_regex(targets))
    model = get_peft_model(backbone, config)
    generator = torch.Generator().manual_seed(recipe.seed)
    with torch.no_grad():  # PEFT starts B at zero (no change); a trained adapter has both non-zero
        for name, p in model.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                p.copy_(recipe.std * torch.randn(p.shape, generator=generator))
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp / "adapter")
    save_state_dict(tmp / "joint_head.safetensors", random_state_dict(HeadConfig(**TINY_HEAD), recipe.seed), "F32")
    (tmp / "joint_head_config.json").write_text(json.dumps(TINY_HEAD, indent=2))
    tmp.rename(out)


def merge(hf_model: Path, adapter: Path, out: Path) -> None:
    """clef-finetune's `merge` for the backbone: PEFT's merge_and_unload, saved as a transformers model."""
    import torch
    from peft import PeftModel
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    backbone = Qwen3_5ForConditionalGeneration.from_pretrained(hf_model, dtype=torch.float32).eval()
    PeftModel.from_pretrained(backbone, adapter).merge_and_unload().save_pretrained(out)
    AutoTokenizer.from_pretrained(hf_model).save_pretrained(out)


def build(root: Path = FIXTURES) -> LoraFixtures:
    base = fixturegen.build(root)
    with _lock(root):
        checkpoints = {r.name: root / f"tiny-lora-{r.name}" for r in RECIPES}
        for recipe in RECIPES:
            out = checkpoints[recipe.name]
            if not (out / "adapter" / "adapter_model.safetensors").exists():
                _log(f"building the LoRA checkpoint {out.name}")
                build_checkpoint(base.hf_model, out, recipe)
        return LoraFixtures(base, checkpoints)


def build_vision(root: Path = FIXTURES):
    """The tiny vision fixtures (tests/fixturegen_vision.py) and a random PEFT checkpoint over their backbone (the
    first recipe's): a fine-tune of a model that takes images."""
    from . import fixturegen_vision

    vision = fixturegen_vision.build(root)
    out = root / f"tiny-vl-lora-{RECIPES[0].name}"
    with _lock(root):
        if not (out / "adapter" / "adapter_model.safetensors").exists():
            _log(f"building the LoRA checkpoint {out.name}")
            build_checkpoint(vision.hf_model, out, RECIPES[0])
    return vision, out


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES))
