"""The host emulator's build (tests/kernels/emu/build.py): a kernel source g++ fails on makes its
emulated tests fail with the compiler's errors (a skip would hide a broken source); only a host
that cannot build the emulator at all (no g++, or none with C++20) skips them."""
from __future__ import annotations

import shutil

import pytest

from tests.kernels.emu import build as emu

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this host")


@pytest.fixture
def sources(tmp_path, monkeypatch):
    """A cuda/ of its own (tmp_path/cuda) and a fresh build cache."""
    cuda = tmp_path / "cuda"
    cuda.mkdir()
    monkeypatch.setattr(emu, "CUDA", cuda)
    monkeypatch.setattr(emu, "CACHE", tmp_path / "cache")
    return cuda


def test_a_source_that_compiles_loads(sources, tmp_path):
    (sources / "good.cu").write_text('extern "C" int luce_seven() { return 7; }\n')
    out = tmp_path / "good"
    out.mkdir()
    assert emu.load(["good.cu"], out, "a good source").luce_seven() == 7


def test_a_source_g_plus_plus_rejects_fails_naming_the_error(sources, tmp_path):
    (sources / "bad.cu").write_text('extern "C" int luce_seven() { return seven_undeclared; }\n')
    out = tmp_path / "bad"
    out.mkdir()
    with pytest.raises(RuntimeError, match=r"g\+\+ failed on bad\.cpp: (.|\n)*seven_undeclared"):
        emu.load(["bad.cu"], out, "a broken source")


def test_a_host_without_cxx20_skips(sources, tmp_path, monkeypatch):
    assert emu.cxx20(shutil.which("g++"))   # this host's g++ does compile C++20
    (sources / "bad.cu").write_text("int broken( {\n")
    monkeypatch.setattr(emu, "cxx20", lambda cxx: False)
    out = tmp_path / "old"
    out.mkdir()
    with pytest.raises(pytest.skip.Exception, match="does not compile C\\+\\+20"):
        emu.load(["bad.cu"], out, "a source on an old compiler")
