#!/usr/bin/env python3
"""Build checks `make test` runs (CPU only): every kernel builds and links for AMD (HIP) and
NVIDIA (sm_90), and no kernel spells a warp width.

Warp width: tools/warp_width_lint.py (no literal 32/64 lane width outside cuda/common.cuh).

HIP: hip/hip_build.py builds build/hip_check/libluce_hip.so from every `cuda/<k>.cu` (or its
AMD override `hip/<k>.hip`) for LUCE_HIP_ARCHS (default gfx1100, gfx1151, gfx1201) with
clang-22 over the stand-in headers hip/check/, linking device code against the ROCm device
library and host code against libamdhip64 (-Wl,--no-undefined). hip/README.md says why. Then:
  - every entry point cuda/luce_ops*.h declares is exported;
  - every arch has a code object per source, with no unresolved symbol, and each kernel's
    wave size (metadata .wavefront_size) equals the WARP_SIZE it was compiled for;
  - every kernel the host code can launch (a __device_stub__) is in every arch's code objects,
    and every __global__ function the sources define is among them;
  - the library loads (dlopen, in a child process) and answers luce_abi_version().
A library `make build` made with a real ROCm (luce/lib/libluce_hip.so) gets the same checks.

NVIDIA, when there is an nvcc (tools/cuda_build.py finds it): every cuda/*.cu compiles to
device code for sm_86, sm_89, sm_90 and sm_120 (RTX 3090, RTX 4090, H100/H200, RTX 5090; one
unoptimized -cubin per source and arch, in parallel, passes cached in build/cuda_check/; an
arch the up-to-date library was built for is not compiled twice), and the library `make build`
made (luce/lib/libluce_cuda.so, for the local GPU or sm_90, as sm_90a) must be newer than every
kernel source and export every entry point. Without nvcc these checks are
skipped with a note, unless --require-nvcc.

Objects are cached in build/hip_check/obj/<archs>/ by a hash of the compiler, the flags, the device
library and the source with every header it includes, so an unchanged tree rebuilds nothing.
Exit status 1 on any failure, each with the tool's own message.

    python3 tools/build_check.py [--hip-only | --nvcc-only] [--clang clang++-22] [-j N]
                                 [--opt -O3] [--list-kernels]
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import cuda_build  # noqa: E402
import hip_code_objects  # noqa: E402
import warp_width_lint  # noqa: E402

nvidia_probe = cuda_build.nvidia_probe

_spec = importlib.util.spec_from_file_location("luce_hip_build", ROOT / "hip" / "hip_build.py")
hip_build = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(hip_build)

CUDA_DIR, HIP_DIR = ROOT / "cuda", ROOT / "hip"
CHECK_DIR = ROOT / "build" / "hip_check"
CHECK_LIB = CHECK_DIR / "libluce_hip.so"
HIP_LIB = ROOT / "luce" / "lib" / "libluce_hip.so"
CUDA_LIB = ROOT / "luce" / "lib" / "libluce_cuda.so"
kernel_sources, quoted_includes = hip_build.kernel_sources, hip_build.quoted_includes


def declared_entry_points() -> list[str]:
    """Function names `cuda/luce_ops.h` and the headers it includes (cuda/luce_ops_*.h)
    declare (`<return type> luce_<name>(...);`, any return type)."""
    headers = [CUDA_DIR / "luce_ops.h", *sorted(CUDA_DIR.glob("luce_ops_*.h"))]
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", "\n".join(h.read_text() for h in headers), flags=re.S)
    return sorted(set(re.findall(r"^[ \t]*(?:const[ \t]+)?[A-Za-z_]\w*[ \t]*[\s*][ \t*]*(luce_\w+)\s*\(",
                                 text, flags=re.M)))


def abi_version() -> int:
    return int(re.search(r"#define\s+LUCE_ABI_VERSION\s+(\d+)", (CUDA_DIR / "luce_ops.h").read_text())[1])


def exported_symbols(lib: Path) -> set[str]:
    result = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"nm failed on {lib}: {result.stderr.strip()}")
    return {line.split()[-1] for line in result.stdout.splitlines() if line.strip()}


# Headers of NVIDIA-only kernels (arch-specific instructions behind an arch check, with a
# portable path beside them that HIP builds): their __global__ functions have no AMD code.
# sm_90a warpgroup MMAs (tunes 32 / 64, the warpgroup form of the prompt attention and its
# pre-pass); the few-row decode kernels, which need more shared memory a block than an AMD GPU
# has (cuda/matmul_gemv_rows_launch.cuh: HIP builds do not instantiate them)
NVIDIA_ONLY_HEADERS = ("matmul_prefill_wgmma.cuh", "matmul_gemv_rows.cuh", "matmul_gemv_rows_k.cuh",
                       "attention_prefill_f16_wg.cuh")


def global_function_names() -> set[str]:
    """Names of the __global__ functions the kernel sources (and headers) define, those of
    NVIDIA_ONLY_HEADERS aside."""
    pattern = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\s*\(")
    files = [*kernel_sources(), *(h for h in CUDA_DIR.glob("*.cuh") if h.name not in NVIDIA_ONLY_HEADERS)]
    return {name for f in files for name in pattern.findall(warp_width_lint.strip_comments_and_strings(f.read_text()))}


def inspect_hip_library(lib: Path, archs: list[str], readelf: str, list_kernels: bool = False
                        ) -> tuple[list[str], str]:
    """(errors, one-line summary) of the checks on a built HIP library (module docstring)."""
    rel = lib.relative_to(ROOT) if lib.is_relative_to(ROOT) else lib
    missing = [n for n in declared_entry_points() if n not in exported_symbols(lib)]
    errors = [f"{rel} lacks entry points declared in cuda/luce_ops*.h: {', '.join(missing)}"] if missing else []
    report = hip_code_objects.check_kernels(lib, {a: hip_build.wave_size(a) for a in archs}, readelf,
                                            global_function_names())
    errors += [f"{rel}: {e}" for e in report.errors]
    if list_kernels:
        for arch in archs:
            kernels = report.kernels.get(arch, set())
            print(f"{arch}: {len(kernels)} kernels")
            print("\n".join(f"  {n}" for n in sorted(hip_code_objects.demangle(sorted(kernels)))))
    counts = ", ".join(f"{a} {len(report.kernels.get(a, ()))}" for a in archs)
    summary = (f"{len(declared_entry_points()) - len(missing)} entry points exported; kernels per arch: "
               f"{counts} (wave{hip_build.wave_size(archs[0])}; {report.objects_per_arch} code objects "
               f"per arch; {len(report.launchable)} kernels launchable from host code)")
    return errors, summary


LOAD_PROBE = """import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.luce_error_string.restype = ctypes.c_char_p
status = lib.luce_device_synchronize()
print(lib.luce_abi_version(), lib.luce_error_string(0).decode(), status, lib.luce_error_string(status).decode())
"""


def load_hip_library(lib: Path) -> tuple[str | None, str]:
    """(error or None, what happened): dlopen in a child process (a crash there is a finding,
    not the end of this script); without an AMD GPU the synchronize fails cleanly."""
    try:
        result = subprocess.run([sys.executable, "-c", LOAD_PROBE, str(lib)], capture_output=True,
                                text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return f"loading {lib.name} hung for 120 s", ""
    if result.returncode != 0:
        return f"loading {lib.name} failed (exit {result.returncode}): {result.stderr.strip()[-600:]}", ""
    version, ok_name, status, status_name = result.stdout.split()
    if int(version) != abi_version() or ok_name != "hipSuccess":
        return f"{lib.name} loaded but answers luce_abi_version() = {version}, luce_error_string(0) = {ok_name}", ""
    return None, (f"loaded (dlopen): luce_abi_version() = {version}; luce_device_synchronize() = "
                  f"{status} {status_name}" + (" (no AMD GPU here)" if status != "0" else ""))


def check_hip(clang: str, jobs: int, opt: str = "-O3", list_kernels: bool = False) -> list[str]:
    try:
        archs = hip_build.hip_archs()
        hip_build.wave_flags(archs)
        toolchain, why = hip_build.check_toolchain(clang, archs, CHECK_DIR)
        if toolchain is None:
            return [why]
        toolchain.compile_flags = [opt if f == "-O3" else f for f in toolchain.compile_flags]
        rebuilt = hip_build.build_library(toolchain, CHECK_LIB, CHECK_DIR, archs, jobs)
    except hip_build.HipBuildError as e:
        return [str(e)]
    print(f"build_check: HIP {CHECK_LIB.relative_to(ROOT)} built and linked "
          f"({len(kernel_sources())} sources x {', '.join(archs)}; {rebuilt} rebuilt) with {toolchain.describe}")
    errors: list[str] = []
    readelf = hip_code_objects.find_readelf()
    for lib in [CHECK_LIB] + ([HIP_LIB] if HIP_LIB.exists() else []):
        lib_archs = archs if lib == CHECK_LIB else sorted(hip_code_objects.kernels_by_arch(
            hip_code_objects.code_objects(lib, readelf))) or archs
        found, summary = inspect_hip_library(lib, lib_archs, readelf, list_kernels and lib == CHECK_LIB)
        load_error, loaded = load_hip_library(lib)
        errors += found + ([load_error] if load_error else [])
        if not found and not load_error:
            print(f"build_check: HIP {lib.relative_to(ROOT)} ok: {summary}; {loaded}")
    return errors


CHECK_ARCHS = ("86", "89", "90", "120")   # RTX 3090, RTX 4090, H100/H200, RTX 5090
CUDA_CHECK_DIR = ROOT / "build" / "cuda_check"


def nvcc_device_check(nvcc, jobs: int, archs=CHECK_ARCHS, sources: list[Path] | None = None,
                      cache_dir: Path = CUDA_CHECK_DIR) -> list[str]:
    """Every cuda/*.cu compiled to device code alone (-cubin, no host pass) for each arch, the
    front end and ptxas unoptimized: the check is that every construct exists on the arch (a
    Hopper-only instruction outside its __CUDA_ARCH__ guard fails here), not its speed. A pass is
    remembered by a hash of nvcc, the flags and the source with its headers; cubins go to a
    temporary directory."""
    listed = subprocess.run([nvcc.path, "--list-gpu-code"], capture_output=True, text=True)
    known = set(listed.stdout.split())
    skipped = [a for a in archs if known and f"sm_{a}" not in known]
    archs = [a for a in archs if a not in skipped]
    version = subprocess.run([nvcc.path, "--version"], capture_output=True, text=True).stdout
    common = cuda_build.COMMON_FLAGS + ["-cubin", "-Xcicc", "-O0", "-Xptxas", "-O0"]
    cache_dir.mkdir(parents=True, exist_ok=True)
    work = [(src, arch) for src in (sources or sorted(CUDA_DIR.glob("*.cu"))) for arch in archs]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max(1, jobs)) as pool:
        def one(item):
            src, arch = item
            key = hashlib.sha256("\0".join([version, nvcc.path, *common, arch,
                                             hip_build.source_digest(src)]).encode()).hexdigest()[:20]
            stamp = cache_dir / f"{src.stem}.sm_{arch}.{key}.ok"
            if stamp.exists():
                return None, False
            cmd = [nvcc.path, *common, f"-arch=sm_{arch}", "-o", os.path.join(tmp, f"{src.stem}.{arch}.cubin"), str(src)]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                name = src.relative_to(ROOT) if src.is_relative_to(ROOT) else src
                return f"{name} does not compile for sm_{arch}:\n{(result.stderr or result.stdout).strip()}", True
            stamp.touch()
            return None, True
        results = list(pool.map(one, work))
    errors = [e for e, _ in results if e]
    if not errors:
        compiled = sum(rebuilt for _, rebuilt in results)
        print(f"build_check: CUDA device code compiles for {', '.join(f'sm_{a}' for a in archs)} "
              f"({len(work) // max(1, len(archs))} sources; {compiled} of {len(work)} compiled, the rest "
              f"unchanged; {time.monotonic() - t0:.0f} s) with {nvcc.source}")
    if skipped:
        print(f"build_check: this nvcc cannot target {', '.join(f'sm_{a}' for a in skipped)}: not checked")
    return errors


def check_nvcc(require: bool, jobs: int) -> list[str]:
    nvcc = cuda_build.find_nvcc()
    if nvcc is None:
        msg = (f"nvcc not found: the CUDA compile checks ({', '.join(f'sm_{a}' for a in CHECK_ARCHS)}) "
               "are skipped (set NVCC or CUDA_HOME, or install CUDA)")
        if require:
            return [msg]
        print(f"build_check: {msg}")
        return []
    sources = [*CUDA_DIR.glob("*.cu"), *CUDA_DIR.glob("*.h"), *CUDA_DIR.glob("*.cuh")]
    stale = [p.name for p in sources if CUDA_LIB.exists() and p.stat().st_mtime > CUDA_LIB.stat().st_mtime]
    # an arch the up-to-date library was built for (optimized, sm_90 as sm_90a) needs no second pass
    built_here = set(nvidia_probe.library_archs(CUDA_LIB) or ()) if CUDA_LIB.exists() and not stale else set()
    checked = [a for a in CHECK_ARCHS if a not in built_here]
    if built_here & set(CHECK_ARCHS):
        print(f"build_check: {nvidia_probe.sm_list(sorted(built_here & set(CHECK_ARCHS)))}: compiled by the library build")
    errors = nvcc_device_check(nvcc, jobs, archs=checked)
    if not CUDA_LIB.exists():
        return errors + [f"{CUDA_LIB.relative_to(ROOT)} missing although nvcc exists: run "
                "'python3 setup.py build_ext --inplace' (make build) and read its errors"]
    if stale:
        return errors + [f"{CUDA_LIB.relative_to(ROOT)} is older than {', '.join(sorted(stale))}: "
                "rebuild with 'python3 setup.py build_ext --inplace' (make build)"]
    missing = [n for n in declared_entry_points() if n not in exported_symbols(CUDA_LIB)]
    if missing:
        return errors + [f"{CUDA_LIB.relative_to(ROOT)} lacks entry points declared in cuda/luce_ops*.h: "
                f"{', '.join(missing)} (define them in a cuda/*.cu with extern \"C\")"]
    archs = nvidia_probe.library_archs(CUDA_LIB)
    built = nvidia_probe.sm_list(archs) if archs else "unrecorded archs"
    print(f"build_check: {CUDA_LIB.relative_to(ROOT)} ({built}) ok: {len(declared_entry_points())} entry points exported")
    return errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--hip-only", action="store_true", help="only the warp-width lint and the HIP build")
    which.add_argument("--nvcc-only", action="store_true", help="only the CUDA checks (device code per arch, the library)")
    ap.add_argument("--clang", default=os.environ.get("LUCE_HIP_CLANG", "clang++-22"))
    ap.add_argument("--require-nvcc", action="store_true", help="fail when nvcc is absent")
    ap.add_argument("-j", "--jobs", type=int, default=min(os.cpu_count() or 2, 4))
    ap.add_argument("--opt", default="-O3", help="HIP optimisation level (-O3 as a real build; "
                    "-O0 compiles matmul.cu ~5x faster for a quick syntax check)")
    ap.add_argument("--list-kernels", action="store_true", help="print every kernel of each arch")
    args = ap.parse_args(argv)
    errors: list[str] = []
    if not args.nvcc_only:
        errors += warp_width_lint.lint()
        errors += check_hip(args.clang, max(1, args.jobs), args.opt, args.list_kernels)
    if not args.hip_only:
        errors += check_nvcc(args.require_nvcc, max(1, args.jobs))
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
