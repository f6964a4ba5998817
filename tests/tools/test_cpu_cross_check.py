"""tools/cpu_cross_check.py: the cpu backend's C sources compile for aarch64, and the check
fails on a source that would not (x86 intrinsics outside their guard)."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("cpu_cross_check", ROOT / "tools" / "cpu_cross_check.py")
cross = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cross)

pytestmark = pytest.mark.skipif(shutil.which("clang-22") is None or not (cross.HEADERS / "stdlib.h").exists(),
                                reason="clang-22 or the aarch64 headers are missing (make hip-toolchain cross-headers)")


def test_the_cpu_sources_compile_for_aarch64():
    assert cross.check("clang-22") == []


def test_an_unguarded_x86_intrinsic_is_caught(tmp_path, monkeypatch):
    (tmp_path / "bad.c").write_text("#include <immintrin.h>\nint f(void) { return _mm_popcnt_u32(3); }\n")
    monkeypatch.setattr(cross, "CPU_DIR", tmp_path)
    monkeypatch.setattr(cross, "ROOT", tmp_path)
    errors = cross.check("clang-22")
    assert len(errors) == 1 and "bad.c does not compile for aarch64" in errors[0]
