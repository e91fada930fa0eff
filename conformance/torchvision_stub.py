"""An inert stand-in for torchvision, so SGLang's radix-cache module can be imported next to the CPU torch.

`sglang.srt.mem_cache.radix_cache` imports the memory pool, which imports every model config, which
imports multimodal helpers, which import torchvision. The registry's torchvision is a CUDA build that fails
to load beside the CPU torch 2.13 ("operator torchvision::nms does not exist"), and text prefix caching
never calls it. Any `torchvision.*` import then yields a module of placeholders, and
`importlib.metadata` sees a torchvision 0.28.0 (transformers asks for its version at import time).
Import this module before sglang, in the SGLang driver's process only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import types
from typing import Any

VERSION = "0.28.0"


class _Placeholder:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Placeholder:
        return _Placeholder()

    def __getattr__(self, name: str) -> _Placeholder:
        return _Placeholder()

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> _Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


class _Dist(importlib.metadata.Distribution):
    def read_text(self, filename: str) -> str | None:
        return f"Metadata-Version: 2.1\nName: torchvision\nVersion: {VERSION}\n" if filename == "METADATA" else None

    def locate_file(self, path: Any) -> Any:
        return path


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        m = _Module(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module: types.ModuleType) -> None:
        pass

    def find_distributions(self, context: Any = None) -> list[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        return [_Dist()] if name in (None, "torchvision") else []


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
