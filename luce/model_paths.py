"""Where luce keeps model files: `$LUCE_MODELS`, else `~/.cache/luce/models`.

The default pair served by `make serve` is Qwen2.5-Coder-1.5B-Instruct (target) and
Qwen2.5-Coder-0.5B-Instruct (draft), both Q4_K_M GGUF; `luce.fetch` downloads them.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "LUCE_MODELS"
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def models_dir() -> Path:
    """The model cache directory (not created here)."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "luce" / "models"


def model_path(name: str, directory: Path | str | None = None) -> Path:
    """Path of model file `name` in `directory` (default: the cache); it may not exist."""
    if not name or Path(name).name != name:
        raise ValueError(f"model name must be a bare file name, got {name!r}")
    return Path(directory).expanduser() / name if directory is not None else models_dir() / name
