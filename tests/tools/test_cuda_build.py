"""tools/cuda_build.py and luce.ops.nvidia_probe on a machine without a GPU: fake `nvidia-smi`
scripts on PATH and a PATH without nvcc decide which nvcc builds the library, for which archs,
what `make build` would install (dry run: nothing is downloaded) and the start-up line; with a
real nvcc, the per-arch device-code check (tools/build_check.py) catches an unguarded Hopper-only
instruction."""
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import build_check  # noqa: E402
import cuda_build  # noqa: E402

from luce.ops import auto_backend_choice, cuda_backend_why, cuda_unavailable_reason, nvidia_probe  # noqa: E402
from luce.server.engine_core import backend_line  # noqa: E402

BANNER = "| NVIDIA-SMI 580.82.07    Driver Version: 580.82.07    CUDA Version: {cuda}     |"


def write_script(path: Path, text: str) -> Path:
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A PATH of a bin/ dir plus /usr/bin:/bin (no nvcc), no $NVCC/$CUDA_HOME, no /usr/local/cuda
    and no CUDA wheels; .gpu(csv, cuda) puts a fake nvidia-smi there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    for var in ("NVCC", "CUDA_HOME", "CUDA_PATH", "LUCE_NO_CUDA", "LUCE_CUDA_ARCHS", "LUCE_KERNEL_LIB"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cuda_build, "DEFAULT_CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.setattr(cuda_build, "wheel_nvccs", lambda site_dirs=None: [])

    class Machine:
        root = tmp_path

        def gpu(self, csv: str, cuda: str = "13.0") -> Path:
            return write_script(bin_dir / "nvidia-smi", f"""case "$1" in
  --query-gpu=*) printf '{csv}\\n' ;;
  *) echo '{BANNER.format(cuda=cuda)}' ;;
esac
""")
    if shutil.which("nvcc"):
        pytest.skip("an nvcc on /usr/bin or /bin: cannot make a PATH without one")
    return Machine()


# ---- nvidia-smi ---------------------------------------------------------------------------------
def test_probe_reads_the_gpus_and_the_drivers_cuda_version(machine):
    machine.gpu("NVIDIA GeForce RTX 3090, 8.6\\nNVIDIA GeForce RTX 5090, 12.0", cuda="13.1")
    probe = nvidia_probe.probe()
    assert probe.gpus == (nvidia_probe.NvidiaGpu("NVIDIA GeForce RTX 3090", "86"),
                          nvidia_probe.NvidiaGpu("NVIDIA GeForce RTX 5090", "120"))
    assert probe.driver_cuda == (13, 1)
    assert probe.describe() == "NVIDIA GeForce RTX 3090 (sm_86), NVIDIA GeForce RTX 5090 (sm_120)"


def test_probe_without_nvidia_smi_or_with_a_failing_one_says_why(machine):
    assert nvidia_probe.probe().why_none() == "nvidia-smi absent"
    write_script(machine.root / "bin" / "nvidia-smi", "echo 'NVIDIA-SMI has failed: no driver' >&2; exit 9\n")
    probe = nvidia_probe.probe()
    assert probe.gpus == () and probe.why_none() == "nvidia-smi lists none: nvidia-smi exit 9: NVIDIA-SMI has failed: no driver"


def test_machine_code_runs_on_the_same_major_and_a_newer_minor():
    assert nvidia_probe.runs_on("86", "89") and nvidia_probe.runs_on("80", "86") and nvidia_probe.runs_on("120", "121")
    assert not nvidia_probe.runs_on("89", "86") and not nvidia_probe.runs_on("90", "120")
    assert not nvidia_probe.runs_on("86", "90") and nvidia_probe.runs_on("90a", "90") and not nvidia_probe.runs_on("90a", "100")


# ---- nvcc and archs -----------------------------------------------------------------------------
def test_archs_are_the_local_gpus_then_luce_cuda_archs(machine, monkeypatch):
    assert cuda_build.build_archs() == ["90"]
    machine.gpu("NVIDIA GeForce RTX 4090, 8.9\\nNVIDIA GeForce RTX 4090, 8.9")
    assert cuda_build.build_archs() == ["89"]
    monkeypatch.setenv("LUCE_CUDA_ARCHS", "sm_80;89, 120")
    assert cuda_build.build_archs() == ["89", "80", "120"]
    assert cuda_build.gencode_flags(["86"]) == ["-gencode=arch=compute_86,code=sm_86"]
    assert cuda_build.gencode_flags(["90"]) == ["-gencode=arch=compute_90a,code=sm_90a"]


def test_nvcc_order_env_then_path_then_cuda_home_then_the_wheel(machine, monkeypatch, tmp_path):
    site = tmp_path / "site"
    (site / "nvidia" / "cu13" / "bin").mkdir(parents=True)
    wheel_nvcc = write_script(site / "nvidia" / "cu13" / "bin" / "nvcc", "")
    monkeypatch.setattr(cuda_build, "wheel_nvccs", lambda site_dirs=None: [wheel_nvcc])
    found = cuda_build.find_nvcc()
    assert found.path == str(wheel_nvcc) and "the cu13 CUDA wheels" in found.source
    assert found.link_flags == ("-L", str(site / "nvidia" / "cu13" / "lib"))
    home = tmp_path / "cuda-12.8"
    (home / "bin").mkdir(parents=True)
    write_script(home / "bin" / "nvcc", "")
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert cuda_build.find_nvcc() == cuda_build.Nvcc(str(home / "bin" / "nvcc"), f"{home}/bin/nvcc ($CUDA_HOME)")
    on_path = write_script(tmp_path / "bin" / "nvcc", "")
    assert cuda_build.find_nvcc().source == f"{on_path} (PATH)"
    monkeypatch.setenv("NVCC", str(home / "bin" / "nvcc"))
    assert cuda_build.find_nvcc().source.endswith("($NVCC)")
    monkeypatch.setenv("LUCE_NO_CUDA", "1")
    assert cuda_build.find_nvcc() is None


def test_the_real_wheel_layout_is_found_under_site_packages(tmp_path):
    nvcc = tmp_path / "nvidia" / "cu13" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    write_script(nvcc, "")
    assert cuda_build.wheel_nvccs([str(tmp_path)]) == [nvcc]


# ---- what make build installs -------------------------------------------------------------------
def test_wheels_are_pinned_to_the_drivers_cuda_version():
    wheels, why = cuda_build.wheel_requirements((13, 2))
    assert wheels == ["nvidia-cuda-nvcc>=13.0,<13.3", "nvidia-nvvm>=13.0,<13.3", "nvidia-cuda-crt>=13.0,<13.3",
                      "nvidia-cuda-runtime>=13.0,<13.3", "nvidia-cuda-cccl>=13.0,<13.3"]
    assert "up to 13.2" in why
    wheels, why = cuda_build.wheel_requirements((12, 4))
    assert wheels is None and "install the CUDA 12.4 toolkit" in why and "ptxas only" in why
    assert cuda_build.cuda_python_requirement((12, 4)) == "cuda-python>=12.6,<13"
    assert cuda_build.cuda_python_requirement((13, 0)) == "cuda-python>=13.0,<14"


def test_ensure_installs_nothing_without_nvidia_smi(machine):
    said = []
    assert cuda_build.ensure(dry_run=True, say=said.append) == [] and said == []


def test_ensure_with_a_gpu_and_no_nvcc_names_the_wheels_of_the_driver(machine, monkeypatch):
    machine.gpu("NVIDIA H200, 9.0", cuda="13.0")
    monkeypatch.setattr(cuda_build, "has_cuda_python", lambda: False)
    said = []
    cmd = cuda_build.ensure(dry_run=True, say=said.append)
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"]
    assert "nvidia-cuda-nvcc>=13.0,<13.1" in cmd and "cuda-python>=13.0,<14" in cmd
    assert said[0] == ("luce: NVIDIA H200 (sm_90) is here and no nvcc: installing nvcc from the CUDA 13 "
                       "wheels up to 13.0 (the driver's CUDA version) (~300 MB)")
    write_script(machine.root / "bin" / "nvcc", "")            # a toolkit: only cuda-python
    assert [r for r in cuda_build.ensure(dry_run=True, say=said.append) if "nvidia" in r] == []
    monkeypatch.setattr(cuda_build, "has_cuda_python", lambda: True)
    assert cuda_build.ensure(dry_run=True, say=said.append) == []


def test_ensure_on_a_cuda_12_driver_says_to_install_the_toolkit(machine, monkeypatch):
    machine.gpu("NVIDIA GeForce RTX 3090, 8.6", cuda="12.4")
    monkeypatch.setattr(cuda_build, "has_cuda_python", lambda: True)
    said = []
    assert cuda_build.ensure(dry_run=True, say=said.append) == []
    assert said == ["luce: NVIDIA GeForce RTX 3090 (sm_86) is here but there is no nvcc to build its kernels: "
                    + cuda_build.wheel_requirements((12, 4))[1]]


# ---- the build ----------------------------------------------------------------------------------
def test_build_uses_the_wheel_nvcc_for_the_local_arch_and_records_it(machine, monkeypatch, tmp_path):
    machine.gpu("NVIDIA GeForce RTX 3090, 8.6")
    log = tmp_path / "nvcc.log"
    wheel_nvcc = tmp_path / "site" / "nvidia" / "cu13" / "bin" / "nvcc"
    wheel_nvcc.parent.mkdir(parents=True)
    # records its arguments and writes the -o file
    write_script(wheel_nvcc, f'echo "$@" >> {log}\nwhile [ "$1" != "-o" ]; do shift; done; touch "$2"\n')
    monkeypatch.setattr(cuda_build, "wheel_nvccs", lambda site_dirs=None: [wheel_nvcc])
    said = []
    out = tmp_path / "lib"
    cuda_build.build_library(str(out), say=said.append)
    args = log.read_text().split()
    assert "-gencode=arch=compute_86,code=sm_86" in args and not any("sm_90" in a for a in args)
    assert args[args.index("-L") + 1] == str(wheel_nvcc.parent.parent / "lib")
    assert said == [f"luce: building CUDA kernels for sm_86 (NVIDIA GeForce RTX 3090 (sm_86)) with {wheel_nvcc} "
                    "(the cu13 CUDA wheels)"]
    assert json.loads((out / "libluce_cuda.json").read_text()) == {"archs": ["86"], "nvcc": str(wheel_nvcc)}
    assert nvidia_probe.library_archs(out / "libluce_cuda.so") == ["86"]
    cuda_build.build_library(str(out), say=said.append)          # up to date: nothing runs
    assert len(log.read_text().splitlines()) == 1 and len(said) == 1
    monkeypatch.setenv("LUCE_CUDA_ARCHS", "120")                  # other archs: rebuilt
    cuda_build.build_library(str(out), say=said.append)
    assert len(log.read_text().splitlines()) == 2 and "code=sm_120" in log.read_text().splitlines()[1]


def test_build_without_nvcc_names_the_gpu_and_the_fix(machine):
    said = []
    cuda_build.build_library(str(machine.root / "lib"), say=said.append)
    assert said == ["luce: nvcc not found (nvidia-smi absent); building the cpu backend only "
                    "(set NVCC or CUDA_HOME to add CUDA)"]
    machine.gpu("NVIDIA GeForce RTX 5090, 12.0", cuda="12.8")
    said.clear()
    cuda_build.build_library(str(machine.root / "lib"), say=said.append)
    assert said[0].startswith("luce: NVIDIA GeForce RTX 5090 (sm_120) is here but nvcc is not: the CUDA kernel "
                              "library is not built; the driver supports CUDA 12.8")
    assert not (machine.root / "lib").exists()


# ---- the start-up line --------------------------------------------------------------------------
def fake_library(tmp_path, monkeypatch, archs):
    lib = tmp_path / "libluce_cuda.so"
    lib.write_bytes(b"")
    lib.with_suffix(".json").write_text(json.dumps({"archs": archs, "nvcc": "nvcc"}))
    monkeypatch.setenv("LUCE_KERNEL_LIB", str(lib))
    return lib


def test_start_up_line_without_a_gpu_says_nvidia_smi_is_absent(machine):
    name, why = auto_backend_choice()
    assert name in ("cpu", "numpy") and why.startswith("no NVIDIA GPU found (nvidia-smi absent)")
    assert backend_line("auto")[1].startswith(f"backend {'cpu (' if name == 'cpu' else 'numpy: '}")
    assert "no NVIDIA GPU found (nvidia-smi absent)" in backend_line("auto")[1]


def test_a_gpu_without_the_library_is_named_on_the_start_up_line(machine, monkeypatch, tmp_path):
    machine.gpu("NVIDIA GeForce RTX 3090, 8.6")
    monkeypatch.setenv("LUCE_KERNEL_LIB", str(tmp_path / "missing.so"))
    name, why = auto_backend_choice()
    assert name != "cuda" and why.startswith("an NVIDIA GPU is here (NVIDIA GeForce RTX 3090 (sm_86)) but the "
                                             "CUDA kernel library") and "run 'make build'" in why
    assert why in backend_line("auto")[1]


def test_a_library_for_another_arch_is_refused_with_the_fix(machine, monkeypatch, tmp_path):
    machine.gpu("NVIDIA GeForce RTX 5090, 12.0")
    lib = fake_library(tmp_path, monkeypatch, ["90"])
    assert cuda_unavailable_reason() == (f"the CUDA kernel library {lib} is built for sm_90, which cannot run on "
                                         "NVIDIA GeForce RTX 5090 (sm_120): run 'make build' (it builds for the local GPU)")


def test_a_matching_library_without_cuda_python_or_a_device_says_which(machine, monkeypatch, tmp_path):
    import luce.ops as ops

    machine.gpu("NVIDIA GeForce RTX 4090, 8.9")
    fake_library(tmp_path, monkeypatch, ["86"])               # sm_86 code runs on sm_89
    monkeypatch.setattr(ops, "cuda_device_count", lambda: 0)
    reason = cuda_unavailable_reason()
    assert reason.startswith("an NVIDIA GPU is here (NVIDIA GeForce RTX 4090 (sm_89)) but cuda-python is missing") \
        or reason.startswith("nvidia-smi lists NVIDIA GeForce RTX 4090 (sm_89) but CUDA sees no device")
    monkeypatch.setattr(ops, "cuda_device_count", lambda: 1)
    assert cuda_unavailable_reason() is None
    assert auto_backend_choice() == ("cuda", "NVIDIA GeForce RTX 4090 (sm_89), library built for sm_86")
    assert cuda_backend_why() == "NVIDIA GeForce RTX 4090 (sm_89), library built for sm_86"


# ---- device code per arch (real nvcc) -----------------------------------------------------------
NVCC = cuda_build.find_nvcc() if not os.environ.get("LUCE_NO_CUDA") else None
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no nvcc (set NVCC or CUDA_HOME)")
PDL_KERNEL = """#include "pdl.cuh"
__global__ void k(float *p) { wait_for_prior_kernels(); p[threadIdx.x] = 1.0f; let_dependents_start(); }
"""
UNGUARDED = """__global__ void k(float *p) { asm volatile("griddepcontrol.wait;" ::: "memory"); p[0] = 1.0f; }
"""


@needs_nvcc
def test_device_check_fails_an_unguarded_hopper_instruction_on_sm_86_only(tmp_path):
    src = tmp_path / "unguarded.cu"
    src.write_text(UNGUARDED)
    errors = build_check.nvcc_device_check(NVCC, 2, ("86", "90"), [src], tmp_path / "cache")
    assert len(errors) == 1 and errors[0].startswith(f"{src} does not compile for sm_86:")
    assert "griddepcontrol" in errors[0]


@needs_nvcc
def test_device_check_passes_the_guarded_pdl_calls_and_caches_the_pass(tmp_path, capsys):
    src = tmp_path / "pdl_user.cu"
    src.write_text(PDL_KERNEL)
    assert build_check.nvcc_device_check(NVCC, 2, ("86", "90"), [src], tmp_path / "cache") == []
    assert "(1 sources; 2 of 2 compiled" in capsys.readouterr().out
    assert build_check.nvcc_device_check(NVCC, 2, ("86", "90"), [src], tmp_path / "cache") == []
    assert "0 of 2 compiled" in capsys.readouterr().out


# ---- on a GPU (the lead's device run) -----------------------------------------------------------
@pytest.mark.gpu
def test_on_a_gpu_the_start_up_line_names_it_and_the_librarys_archs():
    from luce.ops.native import kernel_library_path

    probe = nvidia_probe.probe()
    archs = nvidia_probe.library_archs(kernel_library_path("cuda"))
    assert probe.gpus and archs, "nvidia-smi lists the GPU and the build recorded its archs"
    assert all(any(nvidia_probe.runs_on(a, g.arch) for a in archs) for g in probe.gpus)
    assert auto_backend_choice() == ("cuda", f"{probe.describe()}, library built for {nvidia_probe.sm_list(archs)}")
    assert backend_line("auto")[1] == f"backend cuda: {probe.describe()}, library built for {nvidia_probe.sm_list(archs)}"


def test_build_without_a_host_compiler_says_so_and_builds_nothing(machine, monkeypatch, tmp_path):
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\nexit 1\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("NVCC", str(nvcc))
    monkeypatch.delenv("NVCC_CCBIN", raising=False)
    monkeypatch.setattr(cuda_build, "host_compiler", lambda: None)
    said = []
    out = tmp_path / "lib"
    cuda_build.build_library(str(out), say=said.append)
    assert any("C++ host compiler" in line and "g++" in line for line in said), said
    assert not (out / "libluce_cuda.so").exists()


def test_host_compiler_is_nvcc_ccbin_then_gxx_then_cxx(monkeypatch, tmp_path):
    monkeypatch.delenv("NVCC_CCBIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cuda_build.host_compiler() is None
    cxx = tmp_path / "c++"
    cxx.write_text("#!/bin/sh\n")
    cxx.chmod(0o755)
    assert cuda_build.host_compiler() == str(cxx)
    monkeypatch.setenv("NVCC_CCBIN", "/opt/gcc/bin/g++")
    assert cuda_build.host_compiler() == "/opt/gcc/bin/g++"
