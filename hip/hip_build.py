"""Build the HIP kernel library from cuda/*.cu (hip/<k>.hip where an AMD override exists).

Used by setup.py (`make build`: luce/lib/libluce_hip.so with a real ROCm toolchain) and by
tools/build_check.py (`make test`: the same sources built and linked here, on stand-in headers).
Each source becomes one object holding host code plus a code object per LUCE_HIP_ARCHS arch
(non-relocatable device code: `-c`, no -fgpu-rdc), cached by a hash of the compiler, the flags
and every header the source includes; the objects are linked into one shared library.

Toolchains (hip/README.md says why each exists):
  hipcc       ROCm >= 6.0 hipcc ($HIPCC, else hipcc on PATH, else /opt/rocm/bin/hipcc).
  clang-rocm  $LUCE_HIP_CLANG (a clang++ with HIP support) over the ROCm >= 6.0 at $ROCM_PATH.
  check       clang-22 over the stand-in headers hip/check/, a ROCm device library (Debian's
              rocm-device-libs; ISA-version bitcode generated here for archs it lacks) and
              Debian's libamdhip64 to link against. Proves build and link, nothing more.
"""
from __future__ import annotations

import concurrent.futures
import glob
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA_DIR, HIP_DIR = ROOT / "cuda", ROOT / "hip"
DEFAULT_ARCHS = ("gfx1100", "gfx1151", "gfx1201")
MIN_ROCM = (6, 0)  # hip_bf16.h (__hip_bfloat16) and compilers that know gfx11/gfx12
COMMON_FLAGS = ("-x", "hip", "-std=c++17", "-fPIC", "-I", str(CUDA_DIR))
CHECK_PACKAGES = {  # what the `check` toolchain needs, by Debian package
    "clang-22": "clang++-22", "clang-tools-22": "clang-offload-bundler-22 (bundles each object's code objects)",
    "lld-22": "ld.lld-22 (links device code)", "llvm-22": "llvm-readelf-22 (reads code objects)",
    "libamdhip64-dev": "libamdhip64.so (HIP runtime to link against)", "rocm-device-libs": "ocml.bc, ockl.bc"}


class HipBuildError(RuntimeError):
    """A build step failed; the message holds the command's own output."""


def hip_archs(value: str | None = None) -> list[str]:
    """`LUCE_HIP_ARCHS` ("gfx1100;gfx1151" or commas), default gfx1100, gfx1151, gfx1201."""
    value = os.environ.get("LUCE_HIP_ARCHS", "") if value is None else value
    archs: list[str] = []
    for item in value.replace(",", ";").split(";"):
        arch = item.strip().lower()
        if not arch:
            continue
        if not re.fullmatch(r"gfx[0-9]{1,2}[0-9a-f]{2}", arch):
            raise HipBuildError(f"LUCE_HIP_ARCHS: {arch!r} is not an AMD GPU arch (gfx1100, gfx90a, ...)")
        if arch not in archs:
            archs.append(arch)
    return archs or list(DEFAULT_ARCHS)


def wave_size(arch: str) -> int:
    """Lanes per wave luce compiles for: 64 on GCN/CDNA (gfx6..gfx9), 32 on RDNA (gfx10+)."""
    return 64 if int(arch[3:-2]) < 10 else 32


def wave_flags(archs: list[str]) -> list[str]:
    """-DLUCE_WAVE64=1 when every arch runs 64-lane waves. Host launch code sizes blocks and
    grids with the one WARP_SIZE it was compiled with, so one library cannot mix wave sizes."""
    sizes = {wave_size(a) for a in archs}
    if len(sizes) > 1:
        w64 = [a for a in archs if wave_size(a) == 64]
        raise HipBuildError(f"LUCE_HIP_ARCHS mixes 64-lane ({', '.join(w64)}) and 32-lane archs: host "
                            "code sizes launches for one WARP_SIZE, so build them as separate libraries")
    return ["-DLUCE_WAVE64=1"] if sizes == {64} else []


def isa_version(arch: str) -> int:
    """__oclc_ISA_version of an arch: gfx1151 -> 11501, gfx90a -> 9010 (major, minor, stepping)."""
    digits = arch[3:]
    return int(digits[:-2]) * 1000 + int(digits[-2], 16) * 100 + int(digits[-1], 16)


@dataclass
class Toolchain:
    kind: str                 # 'hipcc' | 'clang-rocm' | 'check'
    compiler: str
    compile_flags: list[str]  # after COMMON_FLAGS and the arch flags
    link_flags: list[str]
    describe: str             # one line: what and where
    env: dict[str, str] = field(default_factory=dict)  # added to the compiler's environment
    cache_key: str = ""       # more that the objects depend on (the device library's bytes)

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **self.env})

    def identity(self) -> str:
        result = self.run([self.compiler, "--version"])
        return " ".join(result.stdout.split()[:12]) if result.returncode == 0 else self.compiler


def _version(text: str) -> tuple[int, int] | None:
    match = re.search(r"HIP version:\s*(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def _hipcc(path: str) -> tuple[Toolchain | None, str]:
    env = {"HIP_PLATFORM": "amd"}  # else hipcc picks nvcc when it is on PATH
    result = subprocess.run([path, "--version"], capture_output=True, text=True, env={**os.environ, **env})
    version = _version(result.stdout + result.stderr)
    if version is None:
        return None, f"{path} --version names no HIP version"
    if version < MIN_ROCM:
        return None, (f"{path} is HIP {version[0]}.{version[1]}; luce needs ROCm >= 6.0 "
                      "(hip_bf16.h, gfx1151/gfx1201)")
    return Toolchain("hipcc", path, ["-O3"], ["-Wl,--no-undefined"],
                     f"hipcc {version[0]}.{version[1]} ({path})", env), ""


def _rocm_version(rocm: Path) -> tuple[int, int] | None:
    header = rocm / "include" / "hip" / "hip_version.h"
    if not header.is_file():
        return None
    text = header.read_text(errors="replace")
    major = re.search(r"#define\s+HIP_VERSION_MAJOR\s+(\d+)", text)
    minor = re.search(r"#define\s+HIP_VERSION_MINOR\s+(\d+)", text)
    return (int(major[1]), int(minor[1])) if major and minor else None


def _clang_rocm(clang: str, rocm: Path) -> tuple[Toolchain | None, str]:
    version = _rocm_version(rocm)
    if version is None:
        return None, f"no ROCm at {rocm} (include/hip/hip_version.h): set ROCM_PATH"
    if version < MIN_ROCM or not (rocm / "include" / "hip" / "hip_bf16.h").is_file():
        return None, f"the ROCm at {rocm} is HIP {version[0]}.{version[1]}; luce needs ROCm >= 6.0"
    lib = rocm / "lib"
    return Toolchain("clang-rocm", clang, ["-O3", f"--rocm-path={rocm}"],
                     [f"-L{lib}", "-lamdhip64", f"-Wl,-rpath,{lib}", "-Wl,--no-undefined"],
                     f"{clang} over ROCm {version[0]}.{version[1]} ({rocm})"), ""


def find_rocm_toolchain() -> tuple[Toolchain | None, str]:
    """The real HIP toolchain `make build` uses, or (None, why not) in one line.
    Order: $HIPCC, $LUCE_HIP_CLANG with $ROCM_PATH (default /opt/rocm), hipcc on PATH,
    /opt/rocm/bin/hipcc. $LUCE_NO_HIP skips the HIP build."""
    if os.environ.get("LUCE_NO_HIP"):
        return None, "LUCE_NO_HIP is set"
    if os.environ.get("HIPCC"):
        path = shutil.which(os.environ["HIPCC"])
        return _hipcc(path) if path else (None, f"HIPCC={os.environ['HIPCC']} not found")
    rocm = Path(os.environ.get("ROCM_PATH", "/opt/rocm"))
    if os.environ.get("LUCE_HIP_CLANG"):
        clang = shutil.which(os.environ["LUCE_HIP_CLANG"])
        if clang is None:
            return None, f"LUCE_HIP_CLANG={os.environ['LUCE_HIP_CLANG']} not found"
        return _clang_rocm(clang, rocm)
    reasons = []
    for cand in (shutil.which("hipcc"), str(rocm / "bin" / "hipcc")):
        if cand and os.path.exists(cand):
            toolchain, why = _hipcc(cand)
            if toolchain:
                return toolchain, ""
            reasons.append(why)
    return None, "; ".join(reasons) or "no hipcc on PATH or in /opt/rocm/bin (set HIPCC or LUCE_HIP_CLANG)"


def find_device_libs() -> Path | None:
    """A ROCm device library folder (ocml.bc): $LUCE_HIP_DEVICE_LIBS, $ROCM_PATH, Debian's."""
    cands = [os.environ.get("LUCE_HIP_DEVICE_LIBS"),
             os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), "amdgcn", "bitcode"),
             *sorted(glob.glob("/usr/lib/*/amdgcn/bitcode")), "/usr/lib/amdgcn/bitcode"]
    for cand in cands:
        if cand and (Path(cand) / "ocml.bc").is_file():
            return Path(cand)
    return None


def find_library_file(clang: str, name: str) -> str | None:
    result = subprocess.run([clang, f"-print-file-name={name}"], capture_output=True, text=True)
    path = result.stdout.strip()
    return path if result.returncode == 0 and os.path.isabs(path) and os.path.exists(path) else None


def missing_check_packages(clang: str = "clang++-22") -> list[str]:
    """Debian packages the `check` toolchain lacks here (what `make hip-toolchain` installs)."""
    have = {"clang-22": shutil.which(clang), "clang-tools-22": shutil.which("clang-offload-bundler-22"),
            "lld-22": shutil.which("ld.lld-22"),
            "llvm-22": shutil.which("llvm-readelf-22"), "rocm-device-libs": find_device_libs(),
            "libamdhip64-dev": (find_library_file(clang, "libamdhip64.so") if shutil.which(clang)
                                else glob.glob("/usr/lib/*/libamdhip64.so"))}
    return [pkg for pkg in CHECK_PACKAGES if not have[pkg]]


def device_lib_overlay(clang: str, device_libs: Path, archs: list[str], out: Path) -> Path:
    """A device-library folder for clang's --rocm-device-lib-path: the ROCm bitcode linked in,
    plus oclc_isa_version_<arch>.bc generated for every arch (ROCm 5.2 has none for gfx11/12),
    each also defining __oclc_daz_opt = 0 (denormals kept, HIP's default), which ROCm 5.2's
    ocml reads and clang-22 no longer links a library for."""
    out.mkdir(parents=True, exist_ok=True)
    for src in device_libs.glob("*.bc"):
        link = out / src.name
        if src.name.startswith("oclc_isa_version_"):
            continue
        if link.is_symlink() and os.readlink(link) != str(src):
            link.unlink()  # made for another device library
        if not os.path.lexists(link):
            link.symlink_to(src)
    for arch in archs:
        target = out / f"oclc_isa_version_{arch[3:]}.bc"
        ll = target.with_suffix(".ll")
        text = ('target triple = "amdgcn-amd-amdhsa"\n'
                f"@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) "
                f"constant i32 {isa_version(arch)}, align 4\n"
                "@__oclc_daz_opt = linkonce_odr protected local_unnamed_addr addrspace(4) "
                "constant i8 0, align 1\n")
        if target.exists() and ll.exists() and ll.read_text() == text:
            continue
        ll.write_text(text)
        result = subprocess.run([clang, "-target", "amdgcn-amd-amdhsa", "-nogpulib", "-c", "-emit-llvm",
                                 str(ll), "-o", str(target)], capture_output=True, text=True)
        if result.returncode != 0:
            raise HipBuildError(f"generating {target.name} failed:\n{result.stderr.strip()}")
    return out


def check_toolchain(clang: str, archs: list[str], work_dir: Path) -> tuple[Toolchain | None, str]:
    """The stand-in-header toolchain of the build check (hip/README.md), or (None, why not)."""
    missing = missing_check_packages(clang)
    if missing:
        return None, (f"the HIP build check needs {', '.join(missing)}: run 'make hip-toolchain' "
                      f"(apt-get install {' '.join(missing)})")
    device_libs = find_device_libs()
    overlay = device_lib_overlay(clang, device_libs, archs, work_dir / "device_libs")
    digest = hashlib.sha256()
    isa_files = {f"oclc_isa_version_{a[3:]}.bc" for a in archs}  # other archs' files do not count
    for bc in sorted(overlay.glob("*.bc")):
        if not bc.name.startswith("oclc_isa_version_") or bc.name in isa_files:
            digest.update(bc.name.encode() + bc.read_bytes())
    return Toolchain(
        "check", shutil.which(clang),
        ["-O3", "-mcode-object-version=5", "-nogpuinc", f"--rocm-device-lib-path={overlay}",
         "-I", str(HIP_DIR / "check"), "-Wno-unused-command-line-argument", "-Wno-pass-failed"],
        ["-lamdhip64", "-Wl,--no-undefined"],
        f"{clang} over hip/check stand-ins, device libraries {device_libs}, "
        f"{find_library_file(clang, 'libamdhip64.so')}", cache_key=digest.hexdigest()), ""


# ---- sources and their cache keys ----------------------------------------------------------
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def kernel_sources() -> list[Path]:
    """cuda/*.cu with hip/<k>.hip substituted where an AMD override exists."""
    out = []
    for cu in sorted(CUDA_DIR.glob("*.cu")):
        override = HIP_DIR / f"{cu.stem}.hip"
        out.append(override if override.exists() else cu)
    return out


def quoted_includes(src: Path) -> set[Path]:
    """Every file `src` reaches through #include "..." (beside the includer or in cuda/)."""
    seen: set[Path] = set()
    todo = [src]
    while todo:
        path = todo.pop()
        for name in INCLUDE.findall(path.read_text(errors="replace")):
            for base in (path.parent, CUDA_DIR):
                cand = (base / name).resolve()
                if cand.is_file():
                    if cand not in seen:
                        seen.add(cand)
                        todo.append(cand)
                    break
    return seen


def source_digest(src: Path) -> str:
    """Hash of a source, the headers it includes and every HIP header (hip/, hip/check/)."""
    h = hashlib.sha256()
    for path in sorted({src.resolve(), *quoted_includes(src), *HIP_DIR.rglob("*.h")}):
        h.update(_label(path).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _label(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def compile_command(tc: Toolchain, src: Path, out: Path, archs: list[str]) -> list[str]:
    arch_flags = [f"--offload-arch={a}" for a in archs]
    return [tc.compiler, *COMMON_FLAGS, *arch_flags, *wave_flags(archs), *tc.compile_flags,
            "-c", str(src), "-o", str(out)]


def compile_object(tc: Toolchain, src: Path, archs: list[str], obj_dir: Path, common_key: str
                   ) -> tuple[Path, str | None, bool]:
    """(object path, error text or None, rebuilt?) for one source; cached by content hash."""
    key = hashlib.sha256((common_key + source_digest(src)).encode()).hexdigest()[:20]
    out = obj_dir / f"{src.stem}.{key}.o"
    if out.exists():
        return out, None, False
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    result = tc.run(compile_command(tc, src, tmp, archs))
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        return out, f"{_label(src)}: HIP compile failed\n{(result.stderr or result.stdout).strip()}", True
    for stale in obj_dir.glob(f"{src.stem}.*.o"):
        stale.unlink()
    tmp.rename(out)
    if result.stderr.strip():
        print(f"{_label(src)}: warnings\n{result.stderr.strip()}")
    return out, None, True


def build_library(tc: Toolchain, lib: Path, work_dir: Path, archs: list[str], jobs: int = 2,
                  sources: list[Path] | None = None) -> int:
    """Compile every kernel source (default kernel_sources()) into work_dir/obj/<archs>/
    (cached) and link `lib`; returns how many objects were rebuilt. Raises HipBuildError with
    every compiler error."""
    lib, work_dir = Path(lib), Path(work_dir)
    obj_dir = work_dir / "obj" / "-".join(archs)
    obj_dir.mkdir(parents=True, exist_ok=True)
    common = "\0".join([tc.identity(), tc.cache_key, *compile_command(tc, Path("SRC"), Path("OUT"), archs)])
    sources = sorted(sources or kernel_sources(), key=lambda p: -p.stat().st_size)  # slowest first
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda s: compile_object(tc, s, archs, obj_dir, common), sources))
    errors = [err for _, err, _ in results if err]
    if errors:
        raise HipBuildError("\n".join(errors))
    objects = sorted(str(path) for path, _, _ in results)
    link = [tc.compiler, "-shared", "-fPIC", *objects, *tc.link_flags, "-o", str(lib)]
    stamp = work_dir / f"{lib.name}.link"  # the link command of the library as it stands
    wanted = "\n".join(link)
    if lib.exists() and stamp.exists() and stamp.read_text() == wanted:
        return sum(rebuilt for _, _, rebuilt in results)
    lib.parent.mkdir(parents=True, exist_ok=True)
    result = tc.run(link[:-1] + [str(lib) + ".tmp"])
    if result.returncode != 0:
        raise HipBuildError(f"linking {lib.name} failed:\n{(result.stderr or result.stdout).strip()}")
    os.replace(str(lib) + ".tmp", lib)
    stamp.write_text(wanted)
    return sum(rebuilt for _, _, rebuilt in results)


if __name__ == "__main__":  # `python3 hip/hip_build.py --missing-apt`: for the Makefile
    import sys

    if sys.argv[1:] == ["--missing-apt"]:
        print(" ".join(missing_check_packages(os.environ.get("HIP_CLANG", "clang++-22"))))
        sys.exit(0)
    sys.exit("usage: hip_build.py --missing-apt")
