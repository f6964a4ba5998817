"""Loading the kernel library into luce._cuda and every luce._cuda_<family> module (CPU only).

dlopen and dlsym need no GPU, and a few entry points are host functions (row sizes,
workspace sizes), so these run wherever luce/lib/libluce_cuda.so is built. Wrappers called
before load() and loads of a wrong library must fail with errors that name the fix.
"""
from __future__ import annotations

import ctypes.util
import importlib
import subprocess
import sys

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from luce.ops.native import family_modules, kernel_library_path, load_kernels

# One wrapper call per module, every argument zero: it must stop at the "not loaded" check.
UNLOADED_CALLS = {
    "_cuda": "synchronize()",
    "_cuda_attention": "workspace_bytes(1, 1, 64, 1)",
    "_cuda_conv1d": "conv1d(*[0] * 12)",
    "_cuda_elementwise": "swiglu(0, 0, 0, 0, 0)",
    "_cuda_embedding": "row_bytes(0, 0)",
    "_cuda_fused": "swiglu_quant(*[0] * 7)",
    "_cuda_gather": "gather(*[0] * 8)",
    "_cuda_gdn": "gdn_chunked(*[0] * 15)",
    "_cuda_gdn_tree": "verify_workspace_bytes(0, 0, 0, 0, 0)",
    "_cuda_matmul": "row_bytes(0, 0)",
    "_cuda_pointwise": "unary('silu', 0, 0, 0)",
    "_cuda_sample_rng": "workspace_bytes(1, 1)",
    "_cuda_sampling": "argmax(0, 0, 0, 0)",
    "_cuda_step_ids": "feed_ids(*[0] * 6)",
    "_cuda_tree_conv": "conv_tree(*[0] * 11)",
}


def all_modules() -> list[str]:
    return ["_cuda", *family_modules()]


@pytest.fixture(scope="module")
def library_path() -> str:
    path = kernel_library_path("cuda")
    if path is None:
        pytest.skip("the CUDA kernel library is not built")
    load_kernels("cuda")
    return str(path)


def test_every_module_has_an_unloaded_call():
    missing = set(all_modules()) - set(UNLOADED_CALLS)
    assert not missing, f"add a call for {sorted(missing)} to UNLOADED_CALLS"


def test_wrappers_before_load_name_the_module_and_the_fix():
    names = all_modules()
    lines = [f"import luce.{name}\n"
             f"try:\n    luce.{name}.{UNLOADED_CALLS[name]}\nexcept RuntimeError as e:\n    print(e)\n"
             f"else:\n    print('{name} ran unloaded')\n"
             for name in names if name in UNLOADED_CALLS]
    out = subprocess.run([sys.executable, "-c", "".join(lines)], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == [f"luce.{name} is not loaded: call luce.ops.native.load_kernels() first"
                   for name in names if name in UNLOADED_CALLS]


@pytest.mark.parametrize("name", all_modules())
def test_a_missing_library_is_named_with_the_loader_reason(name):
    module = importlib.import_module(f"luce.{name}")
    with pytest.raises(OSError, match=r"cannot load kernel library /nonexistent/libluce\.so: .*No such file"):
        module.load("/nonexistent/libluce.so")


@pytest.mark.parametrize("name", all_modules())
def test_a_library_without_the_entry_points_says_rebuild(name):
    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no libm to stand in for a wrong library")
    module = importlib.import_module(f"luce.{name}")
    with pytest.raises(OSError, match=rf"kernel library {libm} lacks symbol luce_\w+: rebuild with "
                                      r"'python setup.py build_ext --inplace'"):
        module.load(libm)


def test_a_failed_load_leaves_the_loaded_library_in_place(library_path):
    from luce import _cuda

    with pytest.raises(OSError):
        _cuda.load(ctypes.util.find_library("m") or "/nonexistent/libluce.so")
    assert _cuda.loaded_path() == library_path


def test_loaded_host_entry_points_agree_with_gguf_block_sizes(library_path):
    from luce import _cuda_embedding, _cuda_matmul

    for name, qtype in _cuda_matmul.QTYPES.items():
        values, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
        cols = 3 * 256
        assert _cuda_matmul.row_bytes(qtype, cols) == cols // values * nbytes, name
        assert _cuda_embedding.row_bytes(qtype, cols) == cols // values * nbytes, name
    with pytest.raises(ValueError, match="not supported"):
        _cuda_matmul.row_bytes(_cuda_matmul.QTYPES["Q4_K"], 100)


def test_loaded_workspace_queries_answer_and_reject_bad_sizes(library_path):
    from luce import _cuda_attention, _cuda_gdn_tree, _cuda_matmul

    assert _cuda_attention.workspace_bytes(4, 8, 128, 1) > 0
    with pytest.raises(ValueError, match="negative size"):
        _cuda_attention.workspace_bytes(-1, 8, 128, 1)
    # prompt rows take an entry per 1,024-key split (where the prompt kernel fits), the others per 256 keys
    assert 0 < _cuda_attention.workspace_bytes(4, 8, 128, 4096, 4) <= _cuda_attention.workspace_bytes(4, 8, 128, 4096)
    with pytest.raises(ValueError, match="prompt_rows outside"):
        _cuda_attention.workspace_bytes(4, 8, 128, 1, 5)
    # with kv_indices entries, the f16 prompt kernel's staged keys (where it runs) come after the
    # partials: f16 K and V of every entry's rows, or nothing (no GPU here: a 0-byte probe is fine)
    partials = _cuda_attention.workspace_bytes(4, 8, 128, 4096, 4, 2, 16, 0)
    staged = _cuda_attention.workspace_bytes(4, 8, 128, 4096, 4, 2, 16, 256)
    assert staged in (partials, -(-partials // 256) * 256 + 2 * 2 * 256 * 16 * 2 * 128)
    with pytest.raises(ValueError, match="negative size"):
        _cuda_attention.workspace_bytes(4, 8, 128, 4096, 4, 2, 16, -1)
    assert _cuda_gdn_tree.verify_workspace_bytes(1, 2, 128, 128, 8) >= 0
    with pytest.raises(ValueError, match="unsupported sizes"):
        _cuda_gdn_tree.verify_workspace_bytes(1, 2, 100, 128, 8)
    assert _cuda_matmul.workspace_bytes(4, 256) > 0
