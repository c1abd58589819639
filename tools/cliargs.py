"""The argument parser of `clef-bridge` (kept apart from cli.py, which runs the commands)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..bridge.catalogue.dtypes import HEAD_DTYPES, JOIN_DTYPES, SPLIT_DTYPES, dtype_name
from ..bridge.catalogue.releases import CLEF_OMNI, RELEASES


def n_cpu_moe(text: str) -> int | str:
    """--n-cpu-moe: "auto" or a number of blocks (0 or more)."""
    if text == "auto":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a number of blocks (0 or more) or auto, got {text!r}")
    return int(text)


def hours(text: str) -> float:
    """--bucket: a number of hours above 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"a number of hours above 0 (e.g. 24 or 0.5), got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand with its flags (each flag has help=); dispatch is the caller's."""
    parser = argparse.ArgumentParser(prog="clef-bridge", description="Self-hosted Clef decision models: a llama.cpp "
                                     "GGUF backbone with Clef's joint schema head.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="serve the System One API for every model in models.toml, or one GGUF")
    p.add_argument("gguf", nargs="?", type=Path, help="serve this one GGUF, as llama-server -m does (named after the "
                                                      "file); instead of --models")
    p.add_argument("--head", type=Path, help="with a GGUF: its joint_head.safetensors (default: the one beside it, "
                                             "or a clef GGUF's own)")
    p.add_argument("--mmproj", type=Path, help="with a GGUF: its vision projector, as llama-server's --mmproj "
                                               "(default: mmproj*.gguf beside it)")
    p.add_argument("--models", type=Path, help="the model registry (default: ./models.toml; without one, the "
                                              "built-in demo model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8792, help="port to listen on (default: 8792); with --ray, the Ray it "
                                                          "starts holds the 3 ports after it too")
    p.add_argument("--ray", action="store_true", help="run replicas behind Ray Serve's proxy, as models.toml [ray] "
                                                      "says (needs pip install 'clef-bridge[ray]')")
    p.add_argument("--ray-address", help="with --ray: the Ray cluster to join, e.g. auto or HEAD_IP:6379 "
                                         "(default: RAY_ADDRESS, else a Ray started on this machine, listening on "
                                         "127.0.0.1 only)")
    p.add_argument("--ray-dashboard", action="store_true", help="with --ray: start Ray's dashboard too, on "
                                                                "127.0.0.1:8265 (default: off)")

    p = sub.add_parser("fit", help="GPU memory plan for a GGUF and its head (exit 0 fits, 1 does not)")
    p.add_argument("gguf", nargs="?", type=Path, help="the backbone GGUF")
    p.add_argument("--arch", choices=list(RELEASES),
                   help="plan from published dimensions instead of a file")
    p.add_argument("--quant", type=str.upper, default="Q8_0",
                   help="quantization for --arch: F16, Q8_0, Q6_K, Q5_K_M, Q4_K_M (default: Q8_0)")
    p.add_argument("--vram", help="GPU memory to plan for, e.g. 16GiB (default: free memory read through NVML)")
    p.add_argument("--ctx", type=int, default=16384, help="context (n_ctx) in tokens (default: 16384)")
    p.add_argument("--parallel", type=int, default=1, help="sequences decoded together (n_seq_max, default: 1)")
    p.add_argument("--ubatch", type=int, default=512, help="llama.cpp's n_ubatch (default: 512)")
    p.add_argument("--n-cpu-moe", type=n_cpu_moe, default="auto",
                   help="MoE backbones (Clef-omni): keep the experts of the first N blocks in host memory, as "
                        "models.toml's n_cpu_moe (default: auto, the fewest that fit)")
    p.add_argument("--head-on-gpu", action="store_true", help="count the head on the GPU (head_device = cuda)")
    p.add_argument("--mmproj", type=Path, help="the vision projector GGUF to count (default: mmproj*.gguf beside "
                                              "the GGUF, if any)")
    p.add_argument("--head", type=Path, help="joint_head.safetensors (default: a clef GGUF's embedded head, or the "
                                            "one beside the GGUF, else the released head's shape)")
    p.add_argument("--head-dtype", type=dtype_name, choices=list(HEAD_DTYPES), default="f32",
                   help="the head's matrices on the GPU, as models.toml's head_dtype (default: f32)")
    p.add_argument("--adapters", type=int, default=0,
                   help="LoRA fine-tunes served over the one backbone, each with its own head (default: 0)")
    p.add_argument("--lora-rank", type=int, default=64,
                   help="their rank (default: 64, clef-finetune's; Clef's own recipe is 256)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("pull", help="download a backbone GGUF and its head from the Hugging Face Hub, verify, "
                                    "check, pair, and add it to models.toml")
    p.add_argument("model", choices=list(RELEASES),
                   help="which Clef release (a qwen35 or qwen3vlmoe GGUF's head comes from its repository; a clef "
                        "GGUF carries its own)")
    p.add_argument("--gguf-repo", help=f"hub repository holding the GGUF (clef or qwen35; "
                                       f"{' or '.join(CLEF_OMNI.architectures)} for {CLEF_OMNI.name})")
    p.add_argument("--gguf-file", help="the GGUF's file name in that repository")
    p.add_argument("--revision", help="revision of the release repository (default: main)")
    p.add_argument("--mmproj-file", help="the vision projector's file name in the GGUF repository (default: its "
                                         "mmproj-*.gguf, the f16 one when there are several)")
    p.add_argument("--no-mmproj", action="store_true", help="do not download a vision projector")
    p.add_argument("--verify-against", metavar="REPO", default="",
                   help="compare sampled tensors of the GGUF with this release's safetensors (range requests, a few "
                        "MB) before pairing (default: the model's release repository)")
    p.add_argument("--no-verify", action="store_true", help="skip that comparison (the pairing record then rests "
                                                            "on the downloaded files alone)")
    p.add_argument("--name", help="name of the models.toml entry (default: the model)")
    p.add_argument("--models", type=Path, default=Path("models.toml"), help="the registry to add the entry to "
                                                                            "(default: ./models.toml)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("make-demo", help="write the small random demo model (GGUF, head, models.toml) to a folder")
    p.add_argument("folder", type=Path, help="where to write it")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed writes the same files (default: 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("check", help="refuse a GGUF without its matching head (exit 0 accepted, 1 refused, "
                                     "2 usage or I/O error)")
    p.add_argument("gguf", nargs="?", type=Path, help="the GGUF to check (a qwen35 backbone or a clef GGUF)")
    p.add_argument("--head", type=Path, help="joint_head.safetensors (default: look beside the GGUF)")
    p.add_argument("--pair", type=Path, help="a pairing record from `clef-bridge pair` "
                                            "(default: <gguf stem>.pair.json beside the GGUF, if present)")
    p.add_argument("--models", type=Path, help="check every model of this registry instead of one GGUF")
    p.add_argument("--lora", type=Path, help="a LoRA adapter served over the GGUF (a PEFT adapter folder as "
                                            "clef-finetune writes it, or a GGUF LoRA), as models.toml's `lora`")
    p.add_argument("--verify-against", metavar="REPO", nargs="?", const="", default=None,
                   help="also compare sampled tensors with a release's safetensors on the Hugging Face Hub (range "
                        "requests, a few MB; default REPO: Cloudflare/clef-flash or Cloudflare/clef by width)")
    p.add_argument("--json", action="store_true", help="print one JSON document with every finding")

    p = sub.add_parser("split", help="a llama.cpp clef GGUF -> <stem>.backbone.gguf + joint_head.safetensors + "
                                     "joint_head_config.json + a pairing record")
    p.add_argument("clef", type=Path, help="the clef GGUF (backbone and head in one file)")
    p.add_argument("-o", "--output", type=Path, required=True, help="folder to write the files to")
    p.add_argument("--head-dtype", type=dtype_name, choices=list(SPLIT_DTYPES),
                   help="safetensors dtype of the head (default: bf16 like the release; f32 when the GGUF's is)")
    p.add_argument("--overwrite", action="store_true", help="replace files already in the folder")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("join", help="a backbone GGUF + a safetensors head -> a clef GGUF that llama-server loads")
    p.add_argument("backbone", type=Path, help="the qwen35 backbone GGUF (any quantization; tensors are copied)")
    p.add_argument("head", type=Path, help="joint_head.safetensors (joint_head_config.json beside it)")
    p.add_argument("-o", "--output", type=Path, required=True, help="the clef GGUF to write")
    p.add_argument("--head-dtype", "--head-type", dest="head_dtype", type=dtype_name, choices=list(JOIN_DTYPES),
                   help="type of the head's matrices (default: what upstream's converter writes, the backbone's own "
                        "type when it is F32, F16, BF16 or Q8_0, else the safetensors dtype; norms, biases, scales stay "
                        "F32; --head-type is the deprecated spelling)")
    p.add_argument("--temperature", help="write clef.decision.temperature.* keys: 0.7 for every type, or "
                                         "choice=0.7,score=0.9 (TYPE.BUCKET=T for llama-server's option buckets)")
    p.add_argument("--from-calibration", type=Path, metavar="JSON",
                   help="take the temperatures `clef-bridge calibrate --json` printed (--temperature overrides)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("lora", help="write a PEFT LoRA adapter (clef-finetune's) as llama.cpp's GGUF LoRA for a base "
                                    "GGUF (serve converts and caches by itself; this is for llama-server's --lora)")
    p.add_argument("adapter", type=Path,
                   help="the PEFT adapter folder, or clef-finetune's checkpoint folder holding it")
    p.add_argument("gguf", type=Path, help="the base GGUF it runs over (its metadata gives the layout)")
    p.add_argument("-o", "--output", type=Path, help="where to write (default: <adapter>.lora.gguf beside the adapter)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("pair", help="write a pairing record: head sha256, backbone fingerprint, canary probes")
    p.add_argument("gguf", type=Path, help="the backbone GGUF")
    p.add_argument("head", type=Path, nargs="?", help="its joint_head.safetensors (default: the clef GGUF's embedded "
                                                      "head, or joint_head.safetensors beside the GGUF)")
    p.add_argument("-o", "--output", type=Path, help="where to write (default: <gguf stem>.pair.json beside the GGUF; "
                                                    "with --lora, <adapter>.pair.json beside the adapter)")
    p.add_argument("--lora", type=Path, help="the LoRA adapter the head was trained with (PEFT folder or GGUF LoRA): "
                                            "the canaries run with it and the record names it")
    p.add_argument("--verify-against", metavar="REPO", nargs="?", const="", default=None,
                   help="first compare sampled tensors with a release's safetensors and keep the result in the record")
    p.add_argument("--mmproj", type=Path, help="the vision projector to record an image canary with (default: "
                                              "mmproj*.gguf beside the GGUF, if any)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("decide", help="answer one System One request from a JSON file, printing the response")
    p.add_argument("--models", default="models.toml", help="the model registry (default: ./models.toml)")
    p.add_argument("--model", default="jev-latest", help="model name or alias (default: the registry's default)")
    p.add_argument("--compact", action="store_true", help="print the response on one line")
    p.add_argument("request", help="a JSON file holding the request body ({model, state, questions})")

    p = sub.add_parser("bench", help="latency and throughput of a running server, with optional baselines")
    p.add_argument("--url", required=True, help="server root, e.g. http://127.0.0.1:8792")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts (default: 1,4,16)")
    p.add_argument("--requests", type=int, default=40, help="requests per concurrency level (default: 40)")
    p.add_argument("--model", default="jev-latest", help="model name to send (default: jev-latest)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer")
    p.add_argument("--gguf", type=Path, help="also time the bare llama.cpp prefill of the same tokens with this GGUF")
    p.add_argument("--out", type=Path, help="write latency and throughput charts (PNG, needs matplotlib) here")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    p = sub.add_parser("eval", help="accuracy, calibration and coverage on labelled data (errors first)")
    p.add_argument("--data", type=Path, required=True, help="JSONL of {\"request\": ..., \"labels\": ...}")
    p.add_argument("--url", help="a running server to evaluate")
    p.add_argument("--models", type=Path, help="or a registry, to run a model in this process")
    p.add_argument("--model", help="the model name, with --models")
    p.add_argument("--out", type=Path, help="write report.json, report.md and charts here")
    p.add_argument("--concurrency", type=int, default=4, help="parallel requests with --url (default: 4)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer with --url")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("calibrate", help="fit a temperature per question type on labelled data")
    p.add_argument("--data", type=Path, required=True, help="JSONL of labelled requests")
    p.add_argument("--models", type=Path, required=True, help="the registry holding the model")
    p.add_argument("--model", required=True, help="the model to calibrate")
    p.add_argument("--write", action="store_true", help="store the accepted temperatures in models.toml")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("drift", help="how much a second backbone (e.g. a coarser quantization) moves answers")
    p.add_argument("gguf_a", type=Path, help="the reference backbone, e.g. F16")
    p.add_argument("gguf_b", type=Path, help="the backbone to compare, e.g. Q4_K_M")
    p.add_argument("--head", type=Path, help="joint_head.safetensors used with both (default: each clef GGUF's own "
                                             "head, or the one beside the GGUF)")
    p.add_argument("--data", type=Path, help="labelled or unlabelled requests (JSONL; default: built-in probes)")
    p.add_argument("--ctx", type=int, default=8192, help="n_ctx for both backbones (default: 8192)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("report", help="what a decision log says: agreement of primary and shadow models, answers "
                                      "over time, and with labels accuracy, Brier, ECE and the temperatures to fit "
                                      "(exit 1 when it holds no decision)")
    p.add_argument("log", type=Path, help="the decision log: its file (rotated files beside it are read first) or "
                                          "the folder holding decisions.jsonl")
    p.add_argument("--labels", type=Path, metavar="FILE",
                   help="labels to join on request id and question: JSON lines of {\"request_id\", \"question\", "
                        "\"label\"} (\"state_sha256\" too for one state of a batch), or a CSV with those columns")
    p.add_argument("--bucket", type=hours, default=24.0, metavar="HOURS",
                   help="the drift's time buckets in hours (default: 24)")
    p.add_argument("--plots", type=Path, metavar="DIR", help="write PNG charts here (needs matplotlib): a "
                                                             "reliability diagram per model, answers over time per "
                                                             "question")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    return parser
