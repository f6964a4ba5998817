"""tools/hip_code_objects.py: offload bundles split into per-arch code objects, ELF sections
read (the kernels of a real build are checked in test_build_check.py)."""
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import hip_code_objects  # noqa: E402


def bundle(entries):
    """A clang offload bundle of (target id, bytes) entries, as clang-offload-bundler lays it out."""
    header = len(hip_code_objects.BUNDLE_MAGIC) + 8 + sum(24 + len(t) for t, _ in entries)
    out, offset, table = b"", header, b""
    for target, blob in entries:
        table += struct.pack("<QQQ", offset, len(blob), len(target)) + target.encode()
        offset += len(blob)
        out += blob
    return hip_code_objects.BUNDLE_MAGIC + struct.pack("<Q", len(entries)) + table + out


def test_bundles_split_into_code_objects_per_arch():
    first = bundle([("host-x86_64-unknown-linux-gnu-", b""), ("hipv4-amdgcn-amd-amdhsa--gfx1100", b"A" * 10),
                    ("hipv4-amdgcn-amd-amdhsa--gfx1201", b"B" * 7)])
    second = bundle([("hipv4-amdgcn-amd-amdhsa--gfx1100", b"C" * 3)])
    fatbin = first + b"\0" * (4096 - len(first)) + second
    parts = hip_code_objects.split_bundles(fatbin)
    assert [sorted(p) for p in parts] == [sorted(["host-x86_64-unknown-linux-gnu-", "hipv4-amdgcn-amd-amdhsa--gfx1100",
                                                  "hipv4-amdgcn-amd-amdhsa--gfx1201"]),
                                          ["hipv4-amdgcn-amd-amdhsa--gfx1100"]]
    assert parts[0]["hipv4-amdgcn-amd-amdhsa--gfx1201"] == b"B" * 7 and parts[1]["hipv4-amdgcn-amd-amdhsa--gfx1100"] == b"CCC"
    assert [hip_code_objects.target_arch(t) for t in ("hipv4-amdgcn-amd-amdhsa--gfx1151", "hip-amdgcn-amd-amdhsa--gfx90a:xnack+",
                                                      "host-x86_64-unknown-linux-gnu-")] == ["gfx1151", "gfx90a", None]


def test_elf_section_reads_a_real_executable():
    lib = Path(sys.executable).resolve()
    assert hip_code_objects.elf_section(lib, ".no_such_section") is None
    assert hip_code_objects.elf_section(lib, ".interp").startswith(b"/")  # the dynamic loader's path
