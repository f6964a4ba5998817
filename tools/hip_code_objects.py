"""What a built HIP library holds: its offload bundles, the code object of each gfx arch, the
kernels in each, their wave size, and the kernels its host code can launch.

A HIP shared library keeps each source's fat binary in the `.hip_fatbin` section: one clang
offload bundle per object ("__CLANG_OFFLOAD_BUNDLE__", an entry count, then per entry its
offset, size and target id such as hipv4-amdgcn-amd-amdhsa--gfx1100), each entry an AMDGPU
ELF code object. A kernel is a `<name>.kd` descriptor symbol there; the AMDGPU metadata note
gives its `.wavefront_size`. Host code holds one `__device_stub__` per launchable kernel and a
handle symbol named exactly as the device kernel, which it registers at load time.

    python3 tools/hip_code_objects.py build/hip_check/libluce_hip.so   # kernels per arch
"""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"


def elf_section(path: Path, name: str) -> bytes | None:
    """Bytes of section `name` of a 64-bit little-endian ELF file (None if absent)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = sections[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    for sh_name, _type, _flags, _addr, offset, size, *_ in sections:
        if names[sh_name:names.index(b"\0", sh_name)].decode() == name:
            return data[offset:offset + size]
    return None


def split_bundles(fatbin: bytes) -> list[dict[str, bytes]]:
    """Each offload bundle of a .hip_fatbin section as {target id: code object bytes}."""
    if COMPRESSED_MAGIC in fatbin[:4096] and BUNDLE_MAGIC not in fatbin:
        raise ValueError("compressed offload bundles (--offload-compress): not supported here")
    bundles, pos = [], fatbin.find(BUNDLE_MAGIC)
    while pos >= 0:
        count, = struct.unpack_from("<Q", fatbin, pos + len(BUNDLE_MAGIC))
        cursor, entries, end = pos + len(BUNDLE_MAGIC) + 8, {}, pos
        for _ in range(count):
            offset, size, id_len = struct.unpack_from("<QQQ", fatbin, cursor)
            target = fatbin[cursor + 24:cursor + 24 + id_len].decode()
            cursor += 24 + id_len
            entries[target] = fatbin[pos + offset:pos + offset + size]
            end = max(end, pos + offset + size)
        bundles.append(entries)
        pos = fatbin.find(BUNDLE_MAGIC, max(end, cursor))
    return bundles


def target_arch(target: str) -> str | None:
    """'hipv4-amdgcn-amd-amdhsa--gfx1100' -> 'gfx1100'; None for the host entry."""
    match = re.fullmatch(r"hip(?:v4)?-amdgcn-amd-amdhsa-[^-]*-(gfx[0-9a-f]+)(?::.*)?", target)
    return match[1] if match else None


@dataclass
class CodeObject:
    arch: str
    kernels: list[str] = field(default_factory=list)      # mangled names
    wave_sizes: list[int] = field(default_factory=list)   # one per kernel (metadata)
    undefined: list[str] = field(default_factory=list)    # unresolved symbols: must be empty
    metadata_target: str = ""                             # amdhsa.target


def readelf(tool: str, args: list[str]) -> str:
    result = subprocess.run([tool, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{tool} failed: {result.stderr.strip()}")
    return result.stdout


SYMBOL_LINE = re.compile(r"^[ \t]*\d+:[ \t]+[0-9a-f]+[ \t]+\d+[ \t]+(\w+)[ \t]+(\w+)[ \t]+\w+[ \t]+(\w+)[ \t]*(\S*)$",
                         re.M)  # Num: Value Size Type Bind Vis Ndx Name


def read_code_object(tool: str, arch: str, path: Path) -> CodeObject:
    text = readelf(tool, ["--dyn-symbols", "--notes", "--wide", str(path)])
    co = CodeObject(arch)
    for sym_type, _bind, ndx, name in SYMBOL_LINE.findall(text):
        if ndx == "UND" and name:
            co.undefined.append(name)
        elif sym_type == "OBJECT" and name.endswith(".kd"):
            co.kernels.append(name[:-3])
    co.wave_sizes = [int(v) for v in re.findall(r"\.wavefront_size:\s+(\d+)", text)]
    match = re.search(r"amdhsa\.target:\s+'?([\w.:+-]+)'?", text)
    co.metadata_target = match[1] if match else ""
    return co


def code_objects(lib: Path, tool: str) -> list[CodeObject]:
    """Every device code object of `lib`, in bundle order (one per source object and arch)."""
    fatbin = elf_section(lib, ".hip_fatbin")
    if fatbin is None:
        raise ValueError(f"{lib} has no .hip_fatbin section: it holds no HIP device code")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, bundle in enumerate(split_bundles(fatbin)):
            for target, blob in bundle.items():
                arch = target_arch(target)
                if arch is None or not blob:
                    continue
                path = Path(tmp) / f"{i}-{arch}.co"
                path.write_bytes(blob)
                out.append(read_code_object(tool, arch, path))
    return out


def host_kernels(lib: Path, tool: str) -> tuple[list[str], set[str]]:
    """(host stub names, names of every host symbol): the kernels host code can launch."""
    text = readelf(tool, ["--symbols", "--wide", str(lib)])
    names = {name for _t, _b, _n, name in SYMBOL_LINE.findall(text)}
    return sorted(n for n in names if "__device_stub__" in n), names


def kernels_by_arch(objects: list[CodeObject]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for co in objects:
        out.setdefault(co.arch, set()).update(co.kernels)
    return out


def kernel_of_stub(stub: str) -> str:
    """Mangled kernel name of its host stub: '<n>__device_stub__name' -> '<n - 15>name'."""
    return re.sub(r"(\d+)__device_stub__", lambda m: str(int(m[1]) - len("__device_stub__")), stub)


@dataclass
class KernelReport:
    errors: list[str]
    kernels: dict[str, set[str]]   # arch -> mangled kernel names
    launchable: set[str]           # kernels host code has a stub for
    objects_per_arch: int


def check_kernels(lib: Path, waves: dict[str, int], readelf_tool: str, global_names=()) -> KernelReport:
    """Every kernel the host code can launch is in each arch's code objects (arch -> the wave
    size its kernels must have), each __global__ name in `global_names` has a kernel there, no
    code object leaves a symbol unresolved, and no arch is there that was not asked for."""
    objects = code_objects(lib, readelf_tool)
    by_arch = kernels_by_arch(objects)
    stubs, host_symbols = host_kernels(lib, readelf_tool)
    launchable = {kernel_of_stub(s) for s in stubs}
    errors = []
    for arch, want in waves.items():
        kernels = by_arch.get(arch, set())
        if not kernels:
            errors.append(f"no code object for {arch}")
            continue
        lost = sorted(launchable - kernels)
        if lost:
            errors.append(f"{len(lost)} kernels the host code launches have no {arch} code: "
                          + ", ".join(demangle(lost[:8])))
        extra = sorted(kernels - host_symbols)
        if extra:
            errors.append(f"{arch} kernels without a host handle: {', '.join(extra[:8])}")
        mangled = " ".join(kernels)
        absent = sorted(n for n in global_names if f"{len(n)}{n}" not in mangled)
        if absent:
            errors.append(f"__global__ functions with no {arch} kernel: {', '.join(absent)}")
        for co in (c for c in objects if c.arch == arch):
            if co.undefined:
                errors.append(f"a {arch} code object leaves symbols unresolved: {', '.join(co.undefined[:8])}")
            if len(co.wave_sizes) != len(co.kernels) or set(co.wave_sizes) - {want}:
                errors.append(f"{arch} kernels have wave sizes {sorted(set(co.wave_sizes))}, not the "
                              f"{want} lanes WARP_SIZE was compiled for")
            if not co.metadata_target.endswith(arch):
                errors.append(f"a code object bundled as {arch} says it targets {co.metadata_target!r}")
    others = sorted(set(by_arch) - set(waves))
    if others:
        errors.append(f"code objects for archs not asked for: {', '.join(others)}")
    first = next(iter(waves))
    return KernelReport(errors, by_arch, launchable, sum(co.arch == first for co in objects))


def find_readelf() -> str | None:
    for cand in ("llvm-readelf-22", "/usr/lib/llvm-22/bin/llvm-readelf", "llvm-readelf"):
        if shutil.which(cand):
            return shutil.which(cand)
    return None


def demangle(names: list[str]) -> list[str]:
    tool = shutil.which("llvm-cxxfilt-22") or shutil.which("c++filt")
    if tool is None:
        return names
    result = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    return result.stdout.splitlines() if result.returncode == 0 else names


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    tool = find_readelf()
    if tool is None:
        print("llvm-readelf-22 not found: apt-get install llvm-22", file=sys.stderr)
        return 1
    for arch, kernels in sorted(kernels_by_arch(code_objects(Path(argv[0]), tool)).items()):
        print(f"{arch}: {len(kernels)} kernels")
        for name in sorted(demangle(sorted(kernels))):
            print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
