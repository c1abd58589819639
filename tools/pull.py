"""pull: fetch a GGUF (and, for a plain backbone, the matching head) from the Hugging Face Hub,
verify, check, pair, and add the model to models.toml.

A llama.cpp `clef` GGUF carries its head; a `qwen35` GGUF (Clef-flash, Clef) or a `qwen3vlmoe` GGUF
(Clef-omni's thinker) needs the release's joint_head.safetensors. A projector (mmproj-*.gguf) beside the
GGUF in its repository is downloaded too (Clef-omni's holds its vision and audio towers).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..bridge.catalogue.releases import RELEASES
from ..bridge.config.integrity import check_pair
from ..bridge.config.provenance import sha256_file
from ..bridge.config.registry_file import add_model, has_model
from ..bridge.config.registry_names import name_problem, shown
from ..bridge.gguf.clef_format import CLEF_ARCH
from ..bridge.gguf.reader import read_gguf
from ..head.config import CONFIG_NAME
from ..head.errors import Category, ClefError
from .checks import pair_files

HEAD_FILES = ("joint_head.safetensors", CONFIG_NAME)


class PullError(ClefError):
    category = Category.REFUSED
    error_type = "pull_error"


@dataclass(frozen=True)
class Pulled:
    name: str
    gguf: Path
    head: Path | None  # None: embedded in the clef GGUF
    gguf_sha256: str
    head_sha256: str
    pair: Path
    models_toml: Path
    mmproj: Path | None = None  # the vision projector found beside the GGUF in its repository


def _projector_name(repo: str, revision: str | None, endpoint: str | None, wanted: str | None) -> str | None:
    """The mmproj file to fetch: the one asked for, else the repository's only (or its f16) mmproj-*.gguf."""
    if wanted:
        return wanted
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        files = HfApi(endpoint=endpoint).list_repo_files(repo, revision=revision)
    except HfHubHTTPError as exc:
        raise PullError(f"{repo}: cannot list its files to look for a vision projector: {exc}",
                        fix="pass --mmproj-file NAME, or --no-mmproj") from None
    found = sorted(f for f in files if f.rsplit("/", 1)[-1].startswith("mmproj") and f.endswith(".gguf"))
    if len(found) > 1:
        f16 = [f for f in found if "f16" in f.lower() and "bf16" not in f.lower()]
        found = f16[:1] or found[:1]
    return found[0] if found else None


def _download(repo: str, filename: str, revision: str | None, endpoint: str | None, cache_dir: str | None) -> Path:
    """Download through huggingface_hub (its cache, resume, progress bar), then verify size and sha256."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError

    try:
        meta = get_hf_file_metadata(hf_hub_url(repo, filename, revision=revision, endpoint=endpoint))
        path = Path(hf_hub_download(repo, filename, revision=revision, endpoint=endpoint, cache_dir=cache_dir))
    except (RepositoryNotFoundError, EntryNotFoundError) as exc:
        raise PullError(f"{repo}/{filename}: not found on the hub ({exc.__class__.__name__})") from None
    except HfHubHTTPError as exc:
        raise PullError(f"{repo}/{filename}: download failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the hub client's own transport errors (connection refused, ...)
        raise PullError(f"{repo}/{filename}: cannot reach the hub at {endpoint or 'huggingface.co'}: "
                        f"{type(exc).__name__}: {exc}") from None
    size = path.stat().st_size
    if meta.size is not None and size != meta.size:
        raise PullError(f"{repo}/{filename}: {size} bytes on disk but the hub lists {meta.size}; run pull again")
    etag = (meta.etag or "").strip('"')
    if re.fullmatch(r"[0-9a-f]{64}", etag):  # LFS files: the hub's etag is the sha256 of the content
        digest = sha256_file(path)
        if digest != etag:
            raise PullError(f"{repo}/{filename}: sha256 {digest} does not match the hub's {etag}; the download is "
                            f"damaged: delete {path} and run pull again")
    return path


def pull(model: str, gguf_repo: str, gguf_file: str, models_toml: Path, name: str | None = None,
         revision: str | None = None, mmproj: str | None = None, with_mmproj: bool = True,
         verify_repo: str | None = "") -> Pulled:
    """Download, verify, check and pair; then add the entry to models.toml.

    verify_repo: compare sampled tensors with that release ('' = the model's release repository) before
    pairing; None skips it (the record then rests on the downloaded files alone).
    """
    if model not in RELEASES:
        raise PullError(f"unknown model {model!r}; pull knows {', '.join(RELEASES)}")
    name = name or model
    if name_problem(name):  # the rule models.toml's names follow, before gigabytes are downloaded for it
        raise PullError(f"--name {shown(name)}: {name_problem(name)}")
    if has_model(models_toml, name):  # refuse a taken name before downloading gigabytes
        raise PullError(f"{models_toml} already has [models.{name}]", fix="remove that table or pass --name")
    endpoint = os.environ.get("HF_ENDPOINT")
    cache_dir = os.environ.get("HF_HUB_CACHE")
    gguf = _download(gguf_repo, gguf_file, None, endpoint, cache_dir)
    architecture = read_gguf(gguf).architecture
    release = RELEASES[model]  # its repository and the GGUF architectures it comes as (bridge/catalogue)
    if architecture not in release.architectures:
        raise PullError(f"{gguf_repo}/{gguf_file} is a {architecture} GGUF; {model} comes as "
                        f"{' or '.join(release.architectures)}", fix=f"pick a GGUF of {model} (`clef-bridge fit --arch "
                        f"{model}` compares quantizations)")
    head, head_repo = None, release.repo
    if architecture != CLEF_ARCH:  # a plain backbone: its head comes from the release
        for filename in HEAD_FILES:
            path = _download(head_repo, filename, revision, endpoint, cache_dir)
            head = path if filename.endswith(".safetensors") else head
    projector = _projector_name(gguf_repo, None, endpoint, mmproj) if with_mmproj else None
    projector_path = _download(gguf_repo, projector, None, endpoint, cache_dir) if projector else None
    report = check_pair(gguf, head)
    source = "its embedded head" if head is None else f"{head_repo}'s head"
    if not report.accepted:
        problems = "; ".join(f"{f.code}: {f.message}" for f in report.findings if f.level == "error")
        raise PullError(f"{gguf_repo}/{gguf_file} and {source} do not belong together: {problems}")
    pair_path = models_toml.resolve().parent / f"{name}.pair.json"
    paired = pair_files(gguf, head, pair_path, None if verify_repo is None else verify_repo or head_repo,
                        projector_path)
    if not paired.ok:
        problems = "; ".join(f"{f.code}: {f.message}" for f in paired.report.findings if f.level == "error")
        raise PullError(f"{gguf_repo}/{gguf_file} refused: {problems}", fix="use a GGUF of the release, or pass "
                        "--no-verify if the release repository cannot be reached (nothing then proves provenance)")
    entry = {"gguf": str(gguf), **({"head": str(head)} if head else {}), "gguf_sha256": sha256_file(gguf),
             **({"head_sha256": paired.head_sha256} if head else {}), "pair": str(pair_path),
             **({"mmproj": str(projector_path)} if projector_path else {}),
             "description": f"{model} from {gguf_repo}/{gguf_file} with {source}"}
    add_model(models_toml, name, entry)
    return Pulled(name, gguf, head, entry["gguf_sha256"], paired.head_sha256, pair_path, models_toml, projector_path)
