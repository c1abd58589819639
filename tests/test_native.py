"""bridge/llama/native.py: llama-cpp-python's modules imported on first use, a missing one named with its fix."""

from __future__ import annotations

import json

import pytest
from clef_bridge.bridge.llama.native import INSTALL, LazyModule

pytestmark = pytest.mark.unit


def test_a_lazy_module_imports_on_the_first_name_read_and_reads_the_modules_own_names():
    module = LazyModule("json")
    assert module._module is None  # nothing imported by making it
    assert module.dumps is json.dumps and module.load() is json


def test_a_missing_module_says_what_to_install_when_used_not_when_made():
    module = LazyModule("clef_bridge_no_such_native_library")
    with pytest.raises(ModuleNotFoundError, match="clef_bridge_no_such_native_library is not installed") as e:
        module.llama_decode
    assert INSTALL in str(e.value) and "llama-cpp-python==0.3.36" in INSTALL
