from pathlib import Path

import pytest

from tasks.config import ConfigError, RunConfig, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_demo_config_loads():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    assert cfg.target.source == "demo"
    assert cfg.target.special_tokens["<|im_end|>"] == 2
    assert cfg.run_dir == Path("runs") / "demo"


def test_every_example_config_loads():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        assert isinstance(load_config(path), RunConfig), path


def test_misspelt_key_names_its_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  max_stpes: 10\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "train.max_stpes" in str(err.value)
    assert "Extra inputs are not permitted" in str(err.value)


def test_wrong_type_names_path_and_expectation(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("generate:\n  api:\n    concurrency: lots\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "generate.api.concurrency" in message
    assert "integer" in message and "'lots'" in message


def test_overrides_apply_by_dotted_key(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("name: x\n")
    cfg = load_config(path, {"train.max_steps": 7, "name": "y"})
    assert cfg.train.max_steps == 7 and cfg.name == "y"


def test_config_is_a_prefect_parameter_schema():
    from prefect.utilities.callables import parameter_schema

    from flows.preflight import preflight_flow

    schema = parameter_schema(preflight_flow.fn)
    assert "config" in schema.properties
    assert "RunConfig" in schema.definitions
    assert schema.definitions["RunConfig"]["additionalProperties"] is False


def test_every_config_field_describes_itself():
    """The Prefect parameter form and `--help` show each field's description: none may be missing."""
    from tasks.config import config_fields

    keys = {key: description for key, _, _, description in config_fields()}
    assert {"compute.device", "generate.sources[].path", "merge.sources[].weight", "train.lr"} <= set(keys)
    assert [key for key, description in keys.items() if not description] == []


def test_the_form_labels_read_as_words():
    """Units in brackets and acronyms in capitals, never Pydantic's title-cased field name ("Ttt Steps")."""
    from flows.pipeline import eagle3_pipeline

    definitions = eagle3_pipeline.parameters.model_dump()["definitions"]
    titles = {f"{m}.{k}": p["title"] for m, d in definitions.items() for k, p in d["properties"].items() if "title" in p}
    assert titles["TrainConfig.ttt_steps"] == "TTT steps" and titles["ApiConfig.timeout_s"] == "Timeout (s)"
    assert titles["VllmConfig.cpu_kvcache_gib"] == "CPU KV cache (GiB)" and titles["TrainConfig.lr"] == "Learning rate"
    assert [k for k, t in titles.items() if "_" in t or t.endswith(" S") or "Ttt" in t] == []


def test_chat_format_names_match_the_formats():
    from typing import get_args

    from tasks.config import ChatFormatName
    from tasks.target_model.formats import FORMAT_NAMES

    assert set(get_args(ChatFormatName)) == {"auto", *FORMAT_NAMES}
