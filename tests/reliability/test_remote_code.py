"""trust_remote_code stays off unless the config turns it on; the preflight says when it is on."""

import json
import shutil

import pytest

from tasks.config import TargetConfig
from tasks.target_model.loader import TargetLoadError, load_tokenizer, model_dir
from tasks.target_model.preflight import run_preflight

EVIL = """
import pathlib, os
pathlib.Path(os.environ["DRAFTSMITH_SENTINEL"]).write_text("remote code ran")
from transformers import PreTrainedTokenizerFast
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


@pytest.fixture
def remote_code_dir(tmp_path, monkeypatch):
    """An HF tokenizer directory whose config asks to run its own Python code."""
    src = model_dir(TargetConfig())
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (src / name).exists():
            shutil.copy(src / name, repo / name)
    config = json.loads((repo / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "evil.EvilTokenizer"]}
    (repo / "tokenizer_config.json").write_text(json.dumps(config))
    (repo / "evil.py").write_text(EVIL)
    sentinel = tmp_path / "sentinel"
    monkeypatch.setenv("DRAFTSMITH_SENTINEL", str(sentinel))
    return repo, sentinel


def test_remote_code_does_not_run_by_default(remote_code_dir):
    repo, sentinel = remote_code_dir
    cfg = TargetConfig(source="hf_dir", path=repo)
    assert cfg.trust_remote_code is False
    try:
        load_tokenizer(cfg)
    except TargetLoadError as e:  # transformers may refuse outright (named as the key to set); either way no code ran
        assert "target.trust_remote_code" in str(e)
    assert not sentinel.exists()


def test_remote_code_runs_only_when_turned_on_and_preflight_says_so(remote_code_dir):
    repo, sentinel = remote_code_dir
    cfg = TargetConfig(source="hf_dir", path=repo, trust_remote_code=True)
    tokenizer = load_tokenizer(cfg)
    assert sentinel.read_text() == "remote code ran"
    report = run_preflight(cfg, tokenizer)
    assert report.trust_remote_code and report.ok
