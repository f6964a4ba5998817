"""tools/build_check.py: include scanning, ABI entry points, and a real clang-22 HIP compile
of a good and a broken kernel (skipped when clang++-22 is absent)."""
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import build_check  # noqa: E402

CLANG = "clang++-22"
needs_clang = pytest.mark.skipif(shutil.which(CLANG) is None, reason="clang++-22 not installed")


def test_quoted_includes_follow_the_chain():
    names = {p.name for p in build_check.quoted_includes(ROOT / "cuda" / "rmsnorm.cu")}
    assert {"common.cuh", "luce_ops.h", "compat.h"} <= names


def test_declared_entry_points_cover_the_families():
    names = build_check.declared_entry_points()
    for name in ("luce_abi_version", "luce_rmsnorm", "luce_rotary",
                 "luce_swiglu", "luce_conv1d", "luce_argmax", "luce_top_k_logprobs", "luce_gather"):
        assert name in names
    assert not any(n.endswith("_params") for n in names)


@needs_clang
def test_hip_compile_accepts_a_kernel_using_the_warp_helpers(tmp_path):
    import subprocess

    src = tmp_path / "good.cu"
    src.write_text('#include "common.cuh"\n'
                   "__global__ void k(float *p) { p[threadIdx.x] = warp_sum(p[threadIdx.x]); }\n"
                   "int launch(float *p, cudaStream_t s) { k<<<1, WARP_SIZE, 0, s>>>(p);\n"
                   "  return luce_status(cudaGetLastError()); }\n")
    out = tmp_path / "good.s"
    cmd = build_check.hip_command(CLANG, src, "gfx1201", out, "-O1")
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "ds_bpermute" in out.read_text()


@needs_clang
def test_hip_compile_reports_an_error(tmp_path):
    import subprocess

    src = tmp_path / "bad.cu"
    src.write_text('#include "common.cuh"\n__global__ void k(float *p) { p[0] = undeclared_thing; }\n')
    cmd = build_check.hip_command(CLANG, src, "gfx1100", tmp_path / "bad.s", "-O0")
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode != 0 and "undeclared_thing" in result.stderr
