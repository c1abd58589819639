"""llama-cpp-python's modules, imported when first used: importing the backbone, the model or the server loads
no native library, so the registry, the service and the unit tests run without llama-cpp-python installed."""

from __future__ import annotations

import importlib
from types import ModuleType

INSTALL = "pip install llama-cpp-python==0.3.36 (`sh tests/run.sh` builds it from source)"


class LazyModule:
    """A module imported on the first read of one of its names; a missing one names the package to install."""

    def __init__(self, name: str):
        self._name = name
        self._module: ModuleType | None = None

    def load(self) -> ModuleType:
        if self._module is None:
            try:
                self._module = importlib.import_module(self._name)
            except ModuleNotFoundError as e:
                raise ModuleNotFoundError(f"{self._name} is not installed: {INSTALL}", name=e.name) from e
        return self._module

    def __getattr__(self, attr: str):  # only names this object lacks: the module's own
        return getattr(self.load(), attr)


lc = LazyModule("llama_cpp")
lc_ext = LazyModule("llama_cpp.llama_cpp_ext")
mtmd = LazyModule("llama_cpp.mtmd_cpp")
ctypes_ext = LazyModule("llama_cpp._ctypes_extensions")
