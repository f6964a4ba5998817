"""--backend hip where it cannot start: named in BACKENDS, not picked by auto, and asking for
it stops with one line saying what this machine has and what is missing; the CLIs exit with
that line (status 2), no traceback, before fetching or loading any model. (The backend on the
HIP runtime, against a double of hip-python: tests/ops/test_hip_runtime.py.)"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from luce.ops import BACKENDS, auto_backend_choice, backend_error, get_backend, hip_probe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def kfd_node(root, index, version):
    node = root / str(index)
    node.mkdir(parents=True)
    node.joinpath("properties").write_text(f"cpu_cores_count 0\ngfx_target_version {version}\nmax_waves_per_simd 16\n")


def test_kfd_versions_name_archs(tmp_path):
    assert [hip_probe.gfx_name(v) for v in (110000, 110501, 120001, 90010, 90402)] == \
        ["gfx1100", "gfx1151", "gfx1201", "gfx90a", "gfx942"]
    kfd_node(tmp_path, 0, 0)  # the CPU node
    kfd_node(tmp_path, 1, 110000)
    kfd_node(tmp_path, 2, 120001)
    assert hip_probe.amd_gpus(str(tmp_path)) == ["gfx1100", "gfx1201"]
    assert hip_probe.amd_gpus(str(tmp_path / "absent")) == []


def test_findings_line_names_each_part(tmp_path):
    none = hip_probe.HipFindings(None, None, None, [], False)
    assert none.line().startswith("found no AMD GPU (no /dev/kfd: no amdgpu driver), HIP kernel library not built (")
    assert "no ROCm runtime (libamdhip64), no hip-python" in none.line()
    assert [n.split(" ")[0] for n in none.missing()] == ["an", "ROCm", "'pip", "the"]
    lib = tmp_path / "libluce_hip.so"
    some = hip_probe.HipFindings(lib, "libamdhip64.so.6", "6.4.0", ["gfx1100"], True, devices=1)
    assert some.line() == (f"found AMD GPU gfx1100, HIP kernel library {lib}, ROCm runtime libamdhip64.so.6, "
                           "hip-python 6.4.0 (1 HIP device)")
    assert some.missing() == []
    hidden = hip_probe.HipFindings(lib, "libamdhip64.so.6", "6.4.0", ["gfx1100"], True, devices=0)
    assert hidden.missing() == ["a device hip-python can see (check HIP_VISIBLE_DEVICES and access to /dev/kfd)"]
    unbuilt = hip_probe.HipFindings(None, "libamdhip64.so.6", "6.4.0", ["gfx1100"], True, devices=1)
    assert unbuilt.missing() == ["the HIP kernel library: 'make build' with ROCm's hipcc (LUCE_HIP_ARCHS)"]


def test_hip_is_a_backend_name_that_says_why_it_cannot_start():
    if hip_probe.hip_unavailable_reason() is None:
        pytest.skip("the HIP backend can start here")
    assert "hip" in BACKENDS
    with pytest.raises(RuntimeError) as err:
        get_backend("hip")
    message = str(err.value)
    assert message == backend_error("hip") and "\n" not in message
    for part in ("cannot use the HIP backend: found ", "AMD GPU", "HIP kernel library", "libamdhip64",
                 "hip-python", "; needs ", "or use --backend auto or cpu"):
        assert part in message


def test_auto_without_a_usable_hip_device_says_why(monkeypatch):
    monkeypatch.setattr(hip_probe, "amd_gpus", lambda nodes_dir=hip_probe.KFD_NODES: ["gfx1151"])
    monkeypatch.setattr(hip_probe, "hip_unavailable_reason", lambda: "found nothing; needs everything")
    name, why = auto_backend_choice()
    assert name in ("cuda", "cpu", "numpy")
    if name != "cuda":
        assert "the AMD GPU here (gfx1151) cannot be used: found nothing; needs everything" in why


def test_unknown_backends_still_raise_value_error():
    with pytest.raises(ValueError, match="unknown backend 'rocm'"):
        get_backend("rocm")


@pytest.mark.parametrize("cli, extra", [("serve_cli", []), ("run_cli", ["hello"])])
def test_clis_exit_with_one_line(cli, extra, tmp_path):
    """luce-serve / luce-run --backend hip here (no AMD GPU, no HIP library built)."""
    if hip_probe.hip_unavailable_reason() is None:
        pytest.skip("the HIP backend can start here")
    env = {**os.environ, "HOME": str(tmp_path)}  # a model fetch would land here: none must happen
    result = subprocess.run([sys.executable, "-m", f"luce.server.{cli}", "--backend", "hip", *extra], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"luce-{cli.split('_')[0]}: --backend hip: cannot use the HIP backend: found ")
    assert result.stdout == "" and not (tmp_path / ".cache").exists()
