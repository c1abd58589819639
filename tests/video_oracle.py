"""The clef-omni reference on video requests, run in the oracle environment (tests/fixturegen_video.py makes it).

`python tests/video_oracle.py SPEC.json`, in a venv with torch 2.13 (the index's build), torchvision 0.28 and
transformers 5.20.2: nothing of the project is imported (its venv's torch cannot load torchvision). The spec
names the pinned reference file, the tiny Qwen3-Omni and its head, the processors' settings and the cases; the
answers land in SPEC's `out` folder: answers.json (per case: token ids, unrounded probabilities, the answer,
the 3 x T position ids of the thinker's M-RoPE, the image and video grids, the audio items' mel frames) and
arrays.npz.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np


def load_reference(path: str, sha256: str):
    data = Path(path).read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SystemExit(f"{path}: sha256 {hashlib.sha256(data).hexdigest()} is not the pinned {sha256}")
    spec = importlib.util.spec_from_file_location("clef_omni_reference_video", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def processor(spec: dict, tokenizer):
    from transformers import (
        Qwen2VLImageProcessorPil,
        Qwen2VLVideoProcessor,
        Qwen3OmniMoeProcessor,
        WhisperFeatureExtractor,
    )

    # the image processor the project's image fidelity tests use (tests/fixturegen_omni.py), for equal images
    return Qwen3OmniMoeProcessor(image_processor=Qwen2VLImageProcessorPil(**spec["image_processor"]),
                                 video_processor=Qwen2VLVideoProcessor(**spec["video_processor"]),
                                 feature_extractor=WhisperFeatureExtractor(**spec["feature_extractor"]),
                                 tokenizer=tokenizer)


def rotation(path: str) -> int:
    """The counter-clockwise display rotation PyAV reads from a clip's first frame (its display matrix side data)."""
    import av

    with av.open(path) as container:
        return int(next(container.decode(video=0)).rotation)


def joined(rows) -> np.ndarray:
    import torch

    return (torch.cat(list(rows)) if isinstance(rows, (tuple, list)) else rows).numpy()


def media_pads(config) -> tuple[int, int, int]:
    """The pad tokens whose rows the bridge sends to llama.cpp as embeddings (image, video, audio), from the model's
    own thinker config as the reference reads them: each run of one of them is a llama_decode of its own
    (bridge/llama/omni_positions.py rope_chunks), text runs too."""
    thinker = config.thinker_config
    return thinker.image_token_id, thinker.video_token_id, thinker.audio_token_id


def llama_mask(input_ids: list[int], positions, pads: tuple[int, ...]) -> "torch.Tensor":
    """The attention llama.cpp gives the bridge's prompt, as a 4D float mask [1, 1, T, T]: token i sees token j when
    j was decoded in an earlier or the same llama_decode (the chunks of rope_chunks) and llama.cpp's M-RoPE causal
    rule lets it: t_j < t_i, or t_j == t_i and (row_j, column_j) <= (row_i, column_i) (llama-kv-cache.cpp's
    is_2d_gt), the reference's being plain token order."""
    import torch

    ids = torch.tensor(input_ids)
    kind = torch.where(torch.isin(ids, torch.tensor(pads)), ids, torch.full_like(ids, -1))
    chunk = torch.cat([torch.zeros(1, dtype=torch.long), (kind[1:] != kind[:-1]).long().cumsum(0)])
    t, y, x = (positions[a].reshape(-1) for a in range(3))
    i, j = (slice(None), None), (None, slice(None))
    later_2d = (y[j] > y[i]) | ((y[j] == y[i]) & (x[j] > x[i]))
    sees = (chunk[j] <= chunk[i]) & ((t[j] < t[i]) | ((t[j] == t[i]) & ~later_2d))
    mask = torch.zeros(sees.shape, dtype=torch.float32).masked_fill(~sees, torch.finfo(torch.float32).min)
    return mask[None, None]


def with_llama_mask(model, batch: dict, position_ids, pads: tuple[int, ...]) -> list:
    """The reference's per-question logits with llama.cpp's mask (llama_mask) instead of its own causal one."""
    import torch

    media = dict(batch["media"])
    in_video = bool(media.pop("use_audio_in_video", False))
    dtype = model.output_embeddings.weight.dtype
    for key in ("pixel_values", "pixel_values_videos", "input_features"):
        if key in media:
            media[key] = media[key].to(dtype)
    ids = batch["input_ids"]
    outputs = model.thinker(input_ids=ids, attention_mask=llama_mask(ids[0].tolist(), position_ids[:, 0], pads),
                            position_ids=position_ids, use_cache=False, output_router_logits=False,
                            use_audio_in_video=in_video, return_dict=True, **media)
    return model.head(outputs.logits, ids, batch["attention_mask"], batch["records"],
                      model.output_embeddings.weight)


def main(spec_path: str) -> None:
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    spec = json.loads(Path(spec_path).read_text())
    ref = load_reference(spec["reference"], spec["reference_sha256"])
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(spec["model"])
    config.enable_audio_output = False
    backbone = Qwen3OmniMoeForConditionalGeneration.from_pretrained(spec["model"], config=config, dtype=torch.float32)
    head = ref.JointSchemaHead(**json.loads((Path(spec["head"]).parent / "joint_head_config.json").read_text()))
    head.load_state_dict(load_file(spec["head"]), strict=True)
    model = ref.ClefModel(backbone.thinker, head.float()).eval()
    proc = processor(spec, AutoTokenizer.from_pretrained(spec["model"]))
    seen: dict[str, object] = {}
    model.thinker.model.register_forward_pre_hook(
        lambda m, args, kwargs: seen.__setitem__("position_ids", kwargs["position_ids"]), with_kwargs=True)
    model.thinker.visual.register_forward_hook(lambda m, args, out: seen.__setitem__("visual", out))
    model.thinker.audio_tower.register_forward_hook(lambda m, args, out: seen.__setitem__("audio", out))
    answers: dict[str, dict] = {"_versions": {"transformers": transformers.__version__, "torch": torch.__version__}}
    arrays: dict[str, np.ndarray] = {}
    for name, case in spec["cases"].items():
        record = dict(case["record"], images=case["images"], audio=case["audio"], videos=case["videos"])
        if case["media_kwargs"]:
            record["media_kwargs"] = case["media_kwargs"]
        with torch.inference_mode():
            encoded = ref.encode_record(proc.tokenizer, record, processor=proc)
            seen.clear()
            batch = ref.collate_records([encoded], proc.tokenizer.pad_token_id, torch.device("cpu"))
            logits = model(batch)
            masked = (with_llama_mask(model, batch, seen["position_ids"].clone(), media_pads(config))
                      if encoded.media and "pixel_values_videos" in encoded.media else None)
            full = ref.systemone(model, proc, record)  # encodes and runs the record again: the answer's shape
        media = encoded.media or {}
        answers[name] = {
            "input_ids": list(map(int, encoded.input_ids)),
            "probabilities": {q.question_id: ql.double().softmax(-1).tolist()
                              for q, ql in zip(encoded.questions, logits[0])},
            "answer": full,
            # the same with llama.cpp's attention (llama_mask): what the bridge can reach at best
            "llama_mask_probabilities": {q.question_id: ql.double().softmax(-1).tolist()
                                         for q, ql in zip(encoded.questions, masked[0])} if masked else None,
            "position_ids": seen["position_ids"][:, 0].to(torch.int64).tolist() if "position_ids" in seen else None,
            "video_grid_thw": media["video_grid_thw"].tolist() if "video_grid_thw" in media else [],
            "image_grid_thw": media["image_grid_thw"].tolist() if "image_grid_thw" in media else [],
            # mel frames of each audio item (the request's clips, then the soundtracks), as the processor pads them
            "audio_frames": media["feature_attention_mask"].sum(-1).tolist() if "feature_attention_mask" in media
            else [],
            "video_second_per_grid": [float(s) for s in media.get("video_second_per_grid", [])],
            "use_audio_in_video": bool(media.get("use_audio_in_video", False)),
            # what each video's display matrix says, and the frames the reference's load_video makes of it
            "video_rotation": [rotation(v) for v in case["videos"]],
            "video_frames_shape": [list(ref.load_video(v)[0].shape) for v in case["videos"]],
        }
        if name in spec["arrays_for"]:
            arrays[f"{name}.pixel_values_videos"] = media["pixel_values_videos"].numpy()
            visual = seen["visual"]  # get_video_features splits its rows per video in place afterwards: rejoin
            arrays[f"{name}.video_embeds"] = joined(visual.pooler_output)
            for i, feat in enumerate(visual.deepstack_features):
                arrays[f"{name}.deepstack{i}"] = joined(feat)
            if "audio" in seen:  # the audio items' features and the audio tower's rows (every item, in order)
                arrays[f"{name}.input_features"] = media["input_features"].numpy()
                arrays[f"{name}.audio_embeds"] = seen["audio"].last_hidden_state.numpy()
        print(f"video oracle: {name}: {len(encoded.input_ids)} tokens", file=sys.stderr, flush=True)
    out = Path(spec["out"])
    np.savez(out / "arrays.npz", **arrays)
    (out / "answers.json").write_text(json.dumps(answers))


if __name__ == "__main__":
    main(sys.argv[1])
