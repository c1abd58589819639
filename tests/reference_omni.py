"""Cloudflare's clef-omni reference as an oracle: the unmodified joint_schema_model.py vendored in the
ollajev==0.4.0 wheel (pure Python; nothing of ollajev is imported), pinned by sha256.

The wheel is fetched once with pip into the fixtures folder; loading the module needs torch (the test
extra). The product never imports it.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from functools import cache
from typing import Any

from .fixturegen import FIXTURES, _lock, _log
from .reference import load_pinned

WHEEL = "ollajev==0.4.0"
MEMBER = "ollajev/_vendor/clef_omni/joint_schema_model.py"
REFERENCE_SHA256 = "21d05ebb8cbea26a26af65eca3d16cf4b69bf80a320e2d5b203e86f0d632a670"


@cache
def reference_omni() -> Any:
    """The clef-omni joint_schema_model module; refuses a file whose sha256 drifted."""
    out = FIXTURES / "ollajev"
    path = out / "joint_schema_model.py"
    with _lock(FIXTURES):
        if not path.exists():
            _log(f"downloading the {WHEEL} wheel (Cloudflare's clef-omni reference, vendored)")
            # its metadata says Requires-Python >=3.12: fetch the file without installing anything
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--python-version", "3.12",
                            "--only-binary=:all:", "-d", str(out), WHEEL], check=True)
            [wheel] = out.glob("ollajev-*.whl")
            with zipfile.ZipFile(wheel) as archive:
                path.write_bytes(archive.read(MEMBER))
    return load_pinned(path, REFERENCE_SHA256, "clef_omni_reference_joint_schema_model")
