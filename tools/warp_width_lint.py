"""No literal warp width outside cuda/common.cuh (DESIGN 5): NVIDIA warps and RDNA waves have
32 lanes, GCN/CDNA waves 64, and only WARP_SIZE (cuda/common.cuh) may say which.

Flagged in cuda/*.cu, *.cuh, *.h (but common.cuh), hip/*.hip and hip/compat.h, comments and
strings removed (tools/check_tree.py and tools/build_check.py both run it):
  - warp intrinsics called directly (__shfl*, __ballot*, __activemask, __any_sync, __all_sync,
    __match_*_sync, __reduce_*_sync, warpSize) and full-warp masks (0xffffffff is 32 lanes):
    they go through common.cuh's helpers, which take WARP_SIZE;
  - lane or warp arithmetic on a literal width: threadIdx.x % 32, & 31, / 64, >> 5, and the
    same on a name containing lane, warp or wave;
  - a constant named like a warp width set to 32 or 64 (kWarp = 32, #define WAVE 64).
The quant formats' own 32-value blocks (QK8_0 = 32, v & 31 on a value index) are not widths
and are not flagged: only thread/lane/warp expressions are.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXEMPT = {"common.cuh"}

INTRINSIC = re.compile(r"\b(__shfl\w*|__ballot\w*|__activemask|__any_sync|__all_sync|__match_\w+_sync|"
                       r"__reduce_\w+_sync|warpSize|0x[fF]{8}[uU]?)\b")
INDEX = r"(?:threadIdx\s*\.\s*[xyz]|\b\w*(?:lane|warp|wave|Lane|Warp|Wave)\w*)"
ARITHMETIC = re.compile(INDEX + r"\s*(?:(?:%|/)\s*(?:32|64)|&\s*(?:31|63)|>>\s*[56])[uU]?(?![\w.])")
WIDTH_CONSTANT = re.compile(r"(?:#\s*define\s+|\b(?:int|unsigned|constexpr\s+\w+|const\s+\w+)\s+)"
                            r"\w*(?:warp|wave|WARP|WAVE|Warp|Wave)\w*\b\s*=?\s*\(?\s*(?:32|64)\b(?!\s*[*/+-])")


def strip_comments_and_strings(text: str) -> str:
    """Comments and string/char literals blanked out; newlines kept for line numbers."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), text)


def scanned_files() -> list[Path]:
    files = [*sorted((ROOT / "cuda").glob("*.cu")), *sorted((ROOT / "cuda").glob("*.cuh")),
             *sorted((ROOT / "cuda").glob("*.h")),
             *sorted((ROOT / "hip").glob("*.hip")), ROOT / "hip" / "compat.h"]
    return [f for f in files if f.name not in EXEMPT and f.is_file()]


def lint_text(text: str) -> list[tuple[int, str]]:
    """(line number, what) for each literal warp width in one source's text."""
    out = []
    for number, line in enumerate(strip_comments_and_strings(text).splitlines(), 1):
        for pattern, what in ((INTRINSIC, "a warp intrinsic outside cuda/common.cuh"),
                              (ARITHMETIC, "lane/warp arithmetic on a literal width"),
                              (WIDTH_CONSTANT, "a warp width spelled as a number")):
            match = pattern.search(line)
            if match:
                out.append((number, f"{what}: '{match[0].strip()}' (use WARP_SIZE and the helpers "
                                    "of cuda/common.cuh)"))
    return out


def lint(files: list[Path] | None = None) -> list[str]:
    errors = []
    for path in scanned_files() if files is None else files:
        for number, what in lint_text(path.read_text(errors="replace")):
            errors.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{number}: {what}")
    return errors


if __name__ == "__main__":
    problems = lint()
    print("\n".join(problems) or f"no literal warp width in {len(scanned_files())} files")
    sys.exit(1 if problems else 0)
