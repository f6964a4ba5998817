"""load_model(path, backend) -> model, dispatching on the GGUF architecture.

Model classes register themselves: `register_arch("qwen35", Qwen35Model)` at the bottom of
their module. A registered class provides `from_gguf(gguf, backend, **kwargs) -> model`.
Archs whose class lives in a module not yet imported are listed in ARCH_MODULES; the
loader imports that module on first use, which registers the class.
"""
from __future__ import annotations

import importlib
import os

_REGISTRY: dict[str, type] = {}

# arch -> module that calls register_arch for it when imported
ARCH_MODULES = {
    "qwen2": "luce.models.dense",
    "qwen3": "luce.models.dense",
    "qwen35": "luce.models.qwen35",
    "dflash": "luce.models.dflash",
}


def register_arch(name: str, cls: type) -> None:
    """Make `load_model` build `cls.from_gguf(gguf, backend, **kwargs)` for GGUF arch `name`."""
    if not hasattr(cls, "from_gguf"):
        raise TypeError(f"{cls.__name__} cannot serve arch {name!r}: it has no from_gguf(gguf, backend)")
    _REGISTRY[name] = cls


def model_class(arch: str) -> type:
    """The class registered for `arch`, importing its module from ARCH_MODULES if needed."""
    if arch not in _REGISTRY and arch in ARCH_MODULES:
        importlib.import_module(ARCH_MODULES[arch])
    if arch not in _REGISTRY:
        known = sorted(set(_REGISTRY) | set(ARCH_MODULES))
        raise ValueError(f"no model for GGUF arch {arch!r}: luce supports {', '.join(known)}")
    return _REGISTRY[arch]


def load_model(path: str | os.PathLike, backend="numpy", **kwargs):
    """Open the GGUF at `path` and build its model on `backend` (a name in luce.ops.BACKENDS
    or a Backend).

    Extra keyword arguments go to the model class (e.g. a draft's target model). Weights
    are loaded through the backend; the GGUF file stays mapped while the model lives. Then
    the backend adapts its launches to the model's size (Backend.fit_to_model)."""
    from luce.gguf.reader import GGUFModel
    from luce.ops import get_backend

    gguf = GGUFModel(path)
    cls = model_class(gguf.config.arch)
    backend = get_backend(backend)
    model = cls.from_gguf(gguf, backend, **kwargs)
    backend.fit_to_model(gguf.config)
    return model
