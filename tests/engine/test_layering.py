"""DESIGN.md section 1: the engine never imports a backend (luce.ops) nor a concrete model."""
import subprocess
import sys


def test_engine_imports_no_backend_and_no_model_implementation():
    code = ("import sys, luce.engine, luce.engine.engine; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('luce.'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "luce.engine.engine" in loaded
    assert not [m for m in loaded if m.startswith("luce.ops") or m in ("luce.models.dense", "luce.models.qwen35")]
