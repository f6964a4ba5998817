"""hip/hip_build.py without a GPU: LUCE_HIP_ARCHS parsing, wave sizes, ISA versions, and how
`make build` finds a ROCm toolchain and drives it (a stand-in hipcc records its calls)."""
import os
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import build_check  # noqa: E402

hip_build = build_check.hip_build

FAKE_HIPCC = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "HIP version: VERSION-0"; echo "AMD clang version 18.0.0"; exit 0; fi
echo "HIP_PLATFORM=$HIP_PLATFORM $*" >> "LOG"
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
: > "$out"
"""


def fake_hipcc(tmp_path, version):
    path = tmp_path / "bin" / "hipcc"
    path.parent.mkdir(exist_ok=True)
    path.write_text(FAKE_HIPCC.replace("VERSION", version).replace("LOG", str(tmp_path / "calls.log")))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("HIPCC", "LUCE_HIP_CLANG", "ROCM_PATH", "LUCE_NO_HIP", "LUCE_HIP_ARCHS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_archs_default_and_parse(clean_env):
    assert hip_build.hip_archs() == ["gfx1100", "gfx1151", "gfx1201"]
    assert hip_build.hip_archs(" gfx90a, GFX942;gfx90a ") == ["gfx90a", "gfx942"]
    clean_env.setenv("LUCE_HIP_ARCHS", "gfx1201")
    assert hip_build.hip_archs() == ["gfx1201"]
    with pytest.raises(hip_build.HipBuildError, match="not an AMD GPU arch"):
        hip_build.hip_archs("sm_90")


def test_wave_sizes_and_isa_versions():
    assert [hip_build.wave_size(a) for a in ("gfx906", "gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1201")] == \
        [64, 64, 64, 32, 32, 32]
    assert [hip_build.isa_version(a) for a in ("gfx1100", "gfx1151", "gfx1201", "gfx90a", "gfx1036")] == \
        [11000, 11501, 12001, 9010, 10306]  # ROCm's oclc_isa_version_1036.bc holds 10306


def test_one_library_never_mixes_wave_sizes():
    assert hip_build.wave_flags(["gfx1100", "gfx1201"]) == []
    assert hip_build.wave_flags(["gfx90a", "gfx942"]) == ["-DLUCE_WAVE64=1"]
    with pytest.raises(hip_build.HipBuildError, match="mixes 64-lane .gfx90a. and 32-lane"):
        hip_build.wave_flags(["gfx1100", "gfx90a"])


def test_old_hipcc_is_named_and_refused(tmp_path, clean_env):
    clean_env.setenv("HIPCC", str(fake_hipcc(tmp_path, "5.2.21153")))
    toolchain, why = hip_build.find_rocm_toolchain()
    assert toolchain is None and "is HIP 5.2" in why and "ROCm >= 6.0" in why


def test_hipcc_on_path_is_found_and_no_hip_skips(tmp_path, clean_env):
    hipcc = fake_hipcc(tmp_path, "6.2.41133")
    clean_env.setenv("PATH", f"{hipcc.parent}{os.pathsep}{os.environ['PATH']}")
    toolchain, _ = hip_build.find_rocm_toolchain()
    assert toolchain.kind == "hipcc" and toolchain.compiler == str(hipcc)
    assert toolchain.env == {"HIP_PLATFORM": "amd"}  # hipcc would pick nvcc beside a CUDA toolkit
    clean_env.setenv("LUCE_NO_HIP", "1")
    assert hip_build.find_rocm_toolchain() == (None, "LUCE_NO_HIP is set")


def test_clang_without_a_new_rocm_is_refused(tmp_path, clean_env):
    rocm = tmp_path / "rocm"
    (rocm / "include" / "hip").mkdir(parents=True)
    (rocm / "include" / "hip" / "hip_version.h").write_text("#define HIP_VERSION_MAJOR 5\n#define HIP_VERSION_MINOR 7\n")
    clean_env.setenv("LUCE_HIP_CLANG", sys.executable)  # any executable: it is not run
    clean_env.setenv("ROCM_PATH", str(rocm))
    assert "is HIP 5.7" in hip_build.find_rocm_toolchain()[1]
    (rocm / "include" / "hip" / "hip_version.h").write_text("#define HIP_VERSION_MAJOR 6\n#define HIP_VERSION_MINOR 4\n")
    (rocm / "include" / "hip" / "hip_bf16.h").write_text("")
    toolchain, _ = hip_build.find_rocm_toolchain()
    assert toolchain.kind == "clang-rocm" and f"--rocm-path={rocm}" in toolchain.compile_flags
    assert f"-Wl,-rpath,{rocm / 'lib'}" in toolchain.link_flags


def test_make_build_drives_hipcc_per_source_then_links(tmp_path, clean_env):
    clean_env.setenv("HIPCC", str(fake_hipcc(tmp_path, "6.4.0")))
    toolchain, _ = hip_build.find_rocm_toolchain()
    sources = []
    for name in ("a.cu", "b.cu"):
        sources.append(tmp_path / name)
        sources[-1].write_text(f"// {name}\n")
    lib = tmp_path / "lib" / "libluce_hip.so"
    archs = ["gfx1100", "gfx1151", "gfx1201"]
    assert hip_build.build_library(toolchain, lib, tmp_path / "work", archs, jobs=2, sources=sources) == 2
    calls = (tmp_path / "calls.log").read_text().splitlines()
    compiles, links = [c for c in calls if " -c " in c], [c for c in calls if " -shared " in c]
    assert len(compiles) == 2 and len(links) == 1 and lib.exists()
    for call in compiles:
        assert call.startswith("HIP_PLATFORM=amd ") and " -x hip " in call and "-I " + str(ROOT / "cuda") in call
        assert all(f"--offload-arch={a}" in call for a in archs) and "hip/check" not in call
    assert "-Wl,--no-undefined" in links[0] and links[0].count(".o ") == 2
    assert hip_build.build_library(toolchain, lib, tmp_path / "work", archs, jobs=2, sources=sources) == 0
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 3  # cached: nothing ran again


def test_kernel_sources_prefer_an_amd_override(tmp_path, monkeypatch):
    (tmp_path / "cuda").mkdir()
    (tmp_path / "hip").mkdir()
    for name in ("cuda/a.cu", "cuda/b.cu", "hip/b.hip"):
        (tmp_path / name).write_text("")
    monkeypatch.setattr(hip_build, "CUDA_DIR", tmp_path / "cuda")
    monkeypatch.setattr(hip_build, "HIP_DIR", tmp_path / "hip")
    assert hip_build.kernel_sources() == [tmp_path / "cuda" / "a.cu", tmp_path / "hip" / "b.hip"]


def test_missing_packages_are_named(monkeypatch):
    monkeypatch.setattr(hip_build.shutil, "which", lambda name: None)
    monkeypatch.setattr(hip_build, "find_device_libs", lambda: None)
    monkeypatch.setattr(hip_build.glob, "glob", lambda pattern: [])
    assert hip_build.missing_check_packages() == list(hip_build.CHECK_PACKAGES)
