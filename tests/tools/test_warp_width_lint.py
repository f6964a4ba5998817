"""tools/warp_width_lint.py: literal warp widths are flagged, quant-block 32s are not, and the
kernel tree has none."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import warp_width_lint  # noqa: E402


@pytest.mark.parametrize("line", [
    "const int lane = threadIdx.x % 32;",
    "const int lane = threadIdx.x & 31u;",
    "const int warp = threadIdx.x >> 5;",
    "const int w = warp_id / 64;",
    "int l = my_lane & 63;",
    "v = __shfl_xor_sync(0xffffffffu, v, 1);",
    "if (threadIdx.x < warpSize) return;",
    "unsigned m = __ballot_sync(~0u, p);",
    "constexpr int kWarpSize = 32;",
    "#define WAVE_LANES 64",
    "const unsigned all = 0xFFFFFFFFu;",
    "constexpr int kWaveWidth = (64);",
])
def test_literal_widths_are_flagged(line):
    assert warp_width_lint.lint_text(f"// header\n{line}\n")[0][0] == 2


@pytest.mark.parametrize("line", [
    "const int lane = threadIdx.x % WARP_SIZE;",
    "const int j = v >> 5, l = v & 31;",          # a value's place in a 32-value quant block
    "constexpr int kWarps = kThreads / WARP_SIZE;",
    "const int q = threadIdx.x % 320;",
    "// lane = threadIdx.x % 32 in a comment",
    'const char *s = "lane % 32";',
    "float warp_keys[32];",
    "#define LUCE_ARCH_RUNS_WAVE64 1",
])
def test_other_numbers_pass(line):
    assert warp_width_lint.lint_text(line) == []


def test_the_kernel_tree_spells_no_warp_width():
    assert warp_width_lint.lint() == []
    names = {p.name for p in warp_width_lint.scanned_files()}
    assert "matmul.cu" in names and "compat.h" in names and "common.cuh" not in names


def test_a_flagged_file_is_named_with_its_line(tmp_path):
    bad = tmp_path / "k.cu"
    bad.write_text("#include \"common.cuh\"\n\n__device__ int lane() { return threadIdx.x & 31; }\n")
    assert warp_width_lint.lint([bad]) == [f"{bad}:3: lane/warp arithmetic on a literal width: 'threadIdx.x & 31' "
                                           "(use WARP_SIZE and the helpers of cuda/common.cuh)"]
