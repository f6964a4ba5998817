"""Errors raised while opening and reading GGUF model files.

Every error names the file, the metadata key or tensor at fault, what was expected, what
was found, and what to do about it, e.g.

    /m/x.gguf: unsupported quant type (tensor 'blk.0.attn_q.weight'): expected one of
    F32, F16, Q8_0, found Q2_K. To fix: re-quantize the model to a supported type, ...
"""
from __future__ import annotations

import os


class GGUFError(ValueError):
    """Base class. Attributes: file (str | None), key (metadata key or tensor name | None),
    expected, found (short descriptions | None), problem and fix (sentences)."""

    subject = "key"
    default_fix = ("check that the file is a complete GGUF model written by llama.cpp "
                   "(convert_hf_to_gguf.py / llama-quantize)")

    def __init__(self, problem: str, *, file: str | os.PathLike | None = None,
                 key: str | None = None, expected: object = None, found: object = None,
                 fix: str | None = None, subject: str | None = None):
        self.problem = problem
        if subject is not None:
            self.subject = subject  # what `key` names: "key", "tensor", "at" (an offset)
        self.file = os.fspath(file) if file is not None else None
        self.key = key
        self.expected = expected
        self.found = found
        self.fix = fix if fix is not None else self.default_fix
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.file}: {self.problem}" if self.file else self.problem
        if self.key is not None:
            text += f" ({self.subject} '{self.key}')"
        if self.expected is not None or self.found is not None:
            text += f": expected {self.expected}, found {self.found}"
        text += "."
        if self.fix:
            text += f" To fix: {self.fix}."
        return text

    def __reduce__(self):
        # keyword-only construction: rebuild from the attributes so pickling keeps the message
        return (_rebuild, (type(self), dict(self.__dict__)))


def _rebuild(cls: type, state: dict) -> GGUFError:
    err = cls.__new__(cls)
    err.__dict__.update(state)
    ValueError.__init__(err, str(err))
    return err


class NotGGUFError(GGUFError):
    """Missing path, a directory, an empty file, or bad magic / unsupported version."""
    subject = "field"
    default_fix = "pass the path of a .gguf model file (llama.cpp format, version 2 or 3)"


class TruncatedGGUFError(GGUFError):
    """The header, metadata, tensor table or some tensor's data runs past the end of file."""
    subject = "at"
    default_fix = ("the file is incomplete (interrupted download or copy?): "
                   "download or convert it again and compare its size with the source")


class UnsupportedArchError(GGUFError):
    subject = "key"
    default_fix = "use a model of a supported architecture"


class MissingKeyError(GGUFError):
    subject = "key"
    default_fix = ("re-convert the model with a recent llama.cpp convert_hf_to_gguf.py, "
                   "which writes this key")


class UnsupportedQuantError(GGUFError):
    subject = "tensor"
    default_fix = ("re-quantize the model to a supported type, e.g. "
                   "`llama-quantize --allow-requantize in.gguf out.gguf Q4_K_M` "
                   "(or Q8_0), or convert from the original weights with --outtype f16")


class TensorShapeError(GGUFError):
    subject = "tensor"
    default_fix = ("the tensor does not match the model metadata: the file is corrupt or "
                   "was converted for another model; re-convert it with llama.cpp")


class MissingTensorError(GGUFError):
    subject = "tensor"
    default_fix = ("the file lacks a tensor this architecture needs: re-convert the model "
                   "with a recent llama.cpp convert_hf_to_gguf.py")
