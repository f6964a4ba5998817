"""tools/build_check.py and the HIP library build it runs: include scanning, ABI entry points,
and real clang-22 builds of small HIP libraries (linked against libamdhip64, inspected per
code object, loaded with dlopen). `make test` installs the toolchain first (make
hip-toolchain); run alone without it, the HIP tests say what to install."""
import ctypes
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import build_check  # noqa: E402
import hip_code_objects  # noqa: E402

hip_build = build_check.hip_build
CLANG = "clang++-22"
MISSING = hip_build.missing_check_packages(CLANG)
needs_hip_toolchain = pytest.mark.skipif(
    bool(MISSING), reason=f"needs {', '.join(MISSING)} (make hip-toolchain installs them)")

TINY = """#include "common.cuh"
template <int N> __global__ void fill_kernel(float *p) { p[threadIdx.x] = N + warp_sum(1.0f); }
extern "C" int tiny_warp_size(void) { return WARP_SIZE; }
extern "C" int tiny_launch(float *p, void *stream) {
    fill_kernel<3><<<1, WARP_SIZE, 0, (cudaStream_t)stream>>>(p);
    return luce_status(cudaGetLastError());
}
"""
# the host pass launches fill_kernel<7>, the device pass never instantiates it
HIDDEN = TINY + """extern "C" int tiny_hidden(float *p) {
#ifndef __HIP_DEVICE_COMPILE__
    fill_kernel<7><<<1, 1>>>(p);
#endif
    return 0;
}
"""


def build_tiny(tmp_path, text, archs):
    src = tmp_path / "tiny.cu"
    src.write_text(text)
    toolchain, why = hip_build.check_toolchain(CLANG, archs, tmp_path / "work")
    assert toolchain is not None, why
    lib = tmp_path / "libtiny.so"
    hip_build.build_library(toolchain, lib, tmp_path / "work", archs, jobs=1, sources=[src])
    return lib


def test_quoted_includes_follow_the_chain():
    names = {p.name for p in build_check.quoted_includes(ROOT / "cuda" / "rmsnorm.cu")}
    assert {"common.cuh", "luce_ops.h", "compat.h"} <= names


def test_declared_entry_points_cover_every_return_type():
    names = build_check.declared_entry_points()
    for name in ("luce_abi_version", "luce_error_string", "luce_rmsnorm",
                 "luce_rotary", "luce_swiglu", "luce_conv1d", "luce_argmax", "luce_top_k_logprobs",
                 "luce_gather", "luce_matmul_row_bytes", "luce_attention_workspace_bytes"):
        assert name in names
    assert not any(n.endswith("_params") for n in names)


def test_kernel_of_stub_strips_the_stub_prefix():
    stub = "_ZN12_GLOBAL__N_125__device_stub__mmq_kernelIN2mm9ReaderQ4KEEEvNS_7MmqArgsE"
    assert hip_code_objects.kernel_of_stub(stub) == "_ZN12_GLOBAL__N_110mmq_kernelIN2mm9ReaderQ4KEEEvNS_7MmqArgsE"


def test_global_function_names_see_launch_bounds():
    names = build_check.global_function_names()
    assert {"mmq_kernel", "rmsnorm_warp_kernel", "argmax_finish_kernel", "attention_partition_kernel"} <= names
    # the sm_90a GEMM has no AMD code object to look for; its header exists (the list does not rot)
    assert "mmw_kernel" not in names and "mmh_kernel" in names
    assert all((build_check.CUDA_DIR / h).is_file() for h in build_check.NVIDIA_ONLY_HEADERS)


@needs_hip_toolchain
def test_tiny_library_builds_links_and_loads(tmp_path):
    lib = build_tiny(tmp_path, TINY, ["gfx1100", "gfx1201"])
    report = hip_code_objects.check_kernels(lib, {"gfx1100": 32, "gfx1201": 32}, hip_code_objects.find_readelf(),
                                            ["fill_kernel"])
    assert report.errors == []
    assert report.kernels["gfx1100"] == report.kernels["gfx1201"] == report.launchable
    assert len(report.launchable) == 1 and "fill_kernel" in next(iter(report.launchable))
    assert {"tiny_launch", "tiny_warp_size"} <= build_check.exported_symbols(lib)
    assert ctypes.CDLL(str(lib)).tiny_warp_size() == 32  # host code compiled for 32-lane waves


@needs_hip_toolchain
def test_a_kernel_launched_without_device_code_is_reported(tmp_path):
    lib = build_tiny(tmp_path, HIDDEN, ["gfx1100"])
    report = hip_code_objects.check_kernels(lib, {"gfx1100": 32}, hip_code_objects.find_readelf())
    assert len(report.launchable) == 2 and len(report.kernels["gfx1100"]) == 1
    assert any("have no gfx1100 code" in e and "fill_kernel<7>" in e for e in report.errors), report.errors


@needs_hip_toolchain
def test_wrong_wave_size_and_missing_arch_are_reported(tmp_path):
    lib = build_tiny(tmp_path, TINY, ["gfx1100"])
    report = hip_code_objects.check_kernels(lib, {"gfx1100": 64, "gfx1151": 32}, hip_code_objects.find_readelf(),
                                            ["fill_kernel", "absent_kernel"])
    text = "\n".join(report.errors)
    assert "gfx1100 kernels have wave sizes [32], not the 64 lanes" in text
    assert "no code object for gfx1151" in text
    assert "__global__ functions with no gfx1100 kernel: absent_kernel" in text


@needs_hip_toolchain
def test_wave64_arch_builds_host_and_device_for_64_lanes(tmp_path):
    lib = build_tiny(tmp_path, TINY, ["gfx90a"])
    report = hip_code_objects.check_kernels(lib, {"gfx90a": 64}, hip_code_objects.find_readelf(), ["fill_kernel"])
    assert report.errors == []
    assert ctypes.CDLL(str(lib)).tiny_warp_size() == 64


@needs_hip_toolchain
def test_compile_errors_carry_the_compiler_message(tmp_path):
    with pytest.raises(hip_build.HipBuildError, match="undeclared_thing"):
        build_tiny(tmp_path, '#include "common.cuh"\n__global__ void k(float *p) { p[0] = undeclared_thing; }\n',
                   ["gfx1100"])


@needs_hip_toolchain
def test_objects_are_cached_by_content(tmp_path):
    src = tmp_path / "tiny.cu"
    src.write_text(TINY)
    toolchain, _ = hip_build.check_toolchain(CLANG, ["gfx1100"], tmp_path / "work")
    build = lambda: hip_build.build_library(toolchain, tmp_path / "lib.so", tmp_path / "work", ["gfx1100"],  # noqa: E731
                                            jobs=1, sources=[src])
    assert build() == 1 and build() == 0
    src.write_text(TINY + "// changed\n")
    assert build() == 1


ABI = """#include "common.cuh"
extern "C" int luce_abi_version(void) { return VERSION; }
extern "C" const char *luce_error_string(int status) { return cudaGetErrorString((cudaError_t)status); }
extern "C" int luce_device_synchronize(void) { return luce_status(cudaDeviceSynchronize()); }
"""


@needs_hip_toolchain
def test_load_probe_asks_the_hip_runtime(tmp_path):
    lib = build_tiny(tmp_path, ABI.replace("VERSION", str(build_check.abi_version())), ["gfx1100"])
    error, loaded = build_check.load_hip_library(lib)
    assert error is None
    assert f"luce_abi_version() = {build_check.abi_version()}" in loaded
    assert "luce_device_synchronize() = " in loaded  # libamdhip64 answered (0 only with an AMD GPU)


@needs_hip_toolchain
def test_load_probe_rejects_a_wrong_abi_version(tmp_path):
    lib = build_tiny(tmp_path, ABI.replace("VERSION", "999"), ["gfx1100"])
    error, _ = build_check.load_hip_library(lib)
    assert error is not None and "luce_abi_version() = 999" in error
