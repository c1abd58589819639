"""The clef-omni reference on videos sent as frame arrays and with media_kwargs, run in the video oracle environment
(tests/fixturegen_video_frames.py makes the spec; tests/video_oracle.py's helpers load the model and processor).

`python tests/video_frames_oracle.py SPEC.json`: each case's videos are clips (paths, as the reference reads files)
or frame arrays (.npy files) handed over as JSON gives them, nested lists (`np.load(p).tolist()`), which the
reference's load_video takes as `np.asarray(value)`: int64 frames. answers.json (in SPEC's `out` folder): per case the
token ids, the unrounded probabilities, the answer, the video grids, seconds per grid and use_audio_in_video.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import video_oracle  # tests/, this script's folder


def video(entry: dict):
    """A case's video as the reference gets it from a JSON body: a clip's path, or a frame array's nested lists."""
    return entry["clip"] if "clip" in entry else np.load(entry["frames"]).tolist()


def main(spec_path: str) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    spec = json.loads(Path(spec_path).read_text())
    ref = video_oracle.load_reference(spec["reference"], spec["reference_sha256"])
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(spec["model"])
    config.enable_audio_output = False
    backbone = Qwen3OmniMoeForConditionalGeneration.from_pretrained(spec["model"], config=config, dtype=torch.float32)
    head = ref.JointSchemaHead(**json.loads((Path(spec["head"]).parent / "joint_head_config.json").read_text()))
    head.load_state_dict(load_file(spec["head"]), strict=True)
    model = ref.ClefModel(backbone.thinker, head.float()).eval()
    proc = video_oracle.processor(spec, AutoTokenizer.from_pretrained(spec["model"]))
    answers: dict[str, dict] = {}
    for name, case in spec["cases"].items():
        record = dict(case["record"], videos=[video(v) for v in case["videos"]])
        if case["media_kwargs"] is not None:
            record["media_kwargs"] = case["media_kwargs"]
        with torch.inference_mode():
            encoded = ref.encode_record(proc.tokenizer, record, processor=proc)
            logits = model(ref.collate_records([encoded], proc.tokenizer.pad_token_id, torch.device("cpu")))
            full = ref.systemone(model, proc, record)
        media = encoded.media or {}
        answers[name] = {
            "input_ids": list(map(int, encoded.input_ids)),
            "probabilities": {q.question_id: ql.double().softmax(-1).tolist()
                              for q, ql in zip(encoded.questions, logits[0])},
            "answer": full,
            "video_grid_thw": media["video_grid_thw"].tolist() if "video_grid_thw" in media else [],
            "video_second_per_grid": [float(s) for s in media.get("video_second_per_grid", [])],
            "use_audio_in_video": bool(media.get("use_audio_in_video", False)),
        }
        print(f"video frames oracle: {name}: {len(encoded.input_ids)} tokens", file=sys.stderr, flush=True)
    (Path(spec["out"]) / "answers.json").write_text(json.dumps(answers))


if __name__ == "__main__":
    main(sys.argv[1])
