"""Where training reads hidden states: auto's plan and its line, fp8 storage, the cache's budget and a full disk.

The streamed source itself needs a vLLM server: tests/vllm/test_stream.py (`make test-vllm`).
"""

from __future__ import annotations

import errno
import logging
import shutil

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import save

from tasks.config import RunConfig
from tasks.draft.data import OfflineSource, TrainingRow
from tasks.draft.states import GB, StateCache, plan_hidden_states
from tasks.extract.backend import RowStates
from tasks.extract.shards import StoredStates, bytes_per_token, encode_states, read_rows, write_shard
from tasks.failpoints import failpoint
from tests.tasks.draft_fixture import write_run

H = 576  # the demo target's width
KIMI_K25_HIDDEN = 7168  # Kimi-K2.5's text_config.hidden_size


@pytest.fixture(scope="module")
def run(tmp_path_factory, demo_tokenizer, demo_model):
    return write_run(tmp_path_factory.mktemp("states") / "run", demo_tokenizer, demo_model)


def config_at(run_dir, **train) -> RunConfig:
    return RunConfig.model_validate({"name": run_dir.name, "runs_dir": str(run_dir.parent), "train": train})


def merged_tokens(run_dir) -> int:
    import pyarrow.parquet as pq

    return sum(sum(pq.read_table(p).column("num_tokens").to_pylist()) for p in run_dir.glob("merged/*/*.parquet"))


def test_auto_extracts_when_the_shards_fit_and_streams_when_they_do_not(run, monkeypatch):
    tokens = merged_tokens(run)
    need = tokens * 8 * H
    fits = plan_hidden_states(config_at(run))
    assert (fits.mode, fits.tokens, fits.offline_bytes) == ("offline", tokens, need) and fits.extracts
    assert f"{need:,} B" in fits.line() and "auto: the shards fit" in fits.line() and f"H = {H}" in fits.line()

    tight = plan_hidden_states(config_at(run, disk_budget_gb=(need - 1) / GB))
    assert tight.mode == "stream" and not tight.extracts and "do not fit" in tight.line()
    # The budget is not all: a disk with less free room than the shards streams too.
    monkeypatch.setattr("tasks.draft.states.free_disk", lambda path: 0)
    assert plan_hidden_states(config_at(run)).mode == "offline"  # the shards already there count as room
    shards = list((run / "hidden_states").glob("shard-*.safetensors"))
    monkeypatch.setattr("tasks.draft.states.stage_dir", lambda config, stage: run / "no-shards-here")
    assert shards and plan_hidden_states(config_at(run)).mode == "stream"


def test_a_set_mode_is_kept_and_the_line_prints_the_bytes_for_any_width(run):
    tokens = merged_tokens(run)
    plan = plan_hidden_states(config_at(run, hidden_states="cache"))
    assert plan.mode == "cache" and plan.line().startswith("hidden states: cache (train.hidden_states)")
    kimi = plan_hidden_states(config_at(run), hidden_size=KIMI_K25_HIDDEN)  # Kimi-K2.5's width on the same rows
    assert kimi.offline_bytes == tokens * 57_344 and f"{tokens * 57_344:,} B" in kimi.line()
    fp8 = RunConfig.model_validate(config_at(run).model_dump() | {"extract": {"storage_dtype": "float8_e4m3fn"}})
    assert plan_hidden_states(fp8).offline_bytes == tokens * (4 * H + 16)


def test_the_pipeline_skips_extract_when_training_streams(run, tmp_path, prefect_harness):
    from prefect import flow

    from flows.pipeline import run_stage
    from tasks.run_report import NOT_NEEDED

    shutil.copytree(run / "merged", tmp_path / "streams" / "merged")
    config = config_at(tmp_path / "streams", disk_budget_gb=1e-9)

    @flow
    def extract_step():
        return run_stage("extract", config, False, runner=None)

    summary = extract_step()
    assert summary[NOT_NEEDED] and summary["hidden_states"] == "stream" and summary["offline_bytes"] > 0
    assert not (tmp_path / "streams" / "hidden_states").exists()


def test_train_mode_was_renamed_and_streaming_trains_in_one_process():
    with pytest.raises(ValidationError, match="train.mode is now train.hidden_states"):
        RunConfig.model_validate({"train": {"mode": "offline"}})
    with pytest.raises(ValidationError, match="trains in one process"):
        RunConfig.model_validate({"train": {"hidden_states": "stream", "processes": 2}})


def test_fp8_shards_take_half_the_bytes_and_read_back_within_e4m3_rounding(run, tmp_path):
    """Each token's state is scaled by its own maximum: every value keeps e4m3's 3-bit mantissa (≤ 1/16 relative
    error), and the training reader sees the same numbers the cache would give."""
    source = OfflineSource(run)
    rows = [RowStates(f["aux"].bfloat16(), f["final"].bfloat16()) for f in source.features(range(len(source.rows)))]
    tokens = sum(r.final.shape[0] for r in rows)
    bf16 = write_shard(tmp_path / "bf16.safetensors", rows)
    fp8 = write_shard(tmp_path / "fp8.safetensors", rows, "float8_e4m3fn")
    assert fp8["bytes"] < 0.51 * bf16["bytes"] and abs(fp8["bytes"] - tokens * bytes_per_token(H, "float8_e4m3fn")) < 1024
    spans, offset = [], 0
    for r in rows:
        spans.append((offset, r.final.shape[0]))
        offset += r.final.shape[0]
    for row, back in zip(rows, read_rows(tmp_path / "fp8.safetensors", spans), strict=True):
        for exact, stored in ((row.aux, back.aux), (row.final, back.final)):
            scale = exact.float().view(exact.shape[0], -1, H).abs().amax(-1, keepdim=True)
            error = (stored.float() - exact.float()).view(exact.shape[0], -1, H).abs()
            bound = exact.float().view(exact.shape[0], -1, H).abs() / 15 + scale / 448 / 512  # normal / subnormal e4m3
            assert (error <= bound).all()
            assert (error > 0).any()  # it is fp8, not the bf16 values again
    stored = StoredStates(tmp_path / "fp8.safetensors")
    assert stored.tokens == tokens and stored.span(0, 3)[0].dtype == torch.float32


def rows_named(*names, tokens=(1, 2, 3)):
    return {name: TrainingRow(name, list(tokens), [1] * len(tokens)) for name in names}


def test_the_cache_keeps_its_budget_evicting_the_oldest(tmp_path):
    g = torch.Generator().manual_seed(0)

    def row(n):
        return RowStates(torch.randn(n, 3 * H, generator=g).bfloat16(), torch.randn(n, H, generator=g).bfloat16())

    rows = {f"r{i}": row(10) for i in range(5)}
    keys = rows_named(*rows)
    entry = len(save(encode_states(rows["r0"].aux, rows["r0"].final)))  # one 10-token row's file, in bf16
    assert 10 * 8 * H < entry < 10 * 8 * H + 512
    cache = StateCache(tmp_path / "cache", 3 * entry, "bfloat16", {"target": "t"})
    for rid, states in rows.items():
        got = cache.put(keys[rid], states)
        torch.testing.assert_close(got["aux"], states.aux.float(), rtol=0, atol=0)
    assert cache.bytes <= 3 * entry and cache.evicted == 2
    assert cache.get(keys["r0"]) is None and cache.get(keys["r1"]) is None  # the oldest went first
    torch.testing.assert_close(cache.get(keys["r4"])["final"], rows["r4"].final.float(), rtol=0, atol=0)
    assert not cache.has(rows_named("r4", tokens=(1, 2, 4))["r4"])  # the same id merged anew with other tokens
    # A rerun with the same settings finds what was kept; other settings start it empty.
    assert len(StateCache(tmp_path / "cache", 3 * entry, "bfloat16", {"target": "t"}).entries) == 3
    assert not StateCache(tmp_path / "cache", 3 * entry, "bfloat16", {"target": "other"}).entries


def test_an_fp8_cache_trains_epoch_one_on_what_later_epochs_read(tmp_path):
    states = RowStates(torch.randn(7, 3 * H).bfloat16(), torch.randn(7, H).bfloat16())
    cache = StateCache(tmp_path / "cache", GB, "float8_e4m3fn", {})
    key = rows_named("row")["row"]
    first = cache.put(key, states)
    later = cache.get(key)
    for name in ("aux", "final"):
        torch.testing.assert_close(first[name], later[name], rtol=0, atol=0)
        assert not torch.equal(first[name], getattr(states, name).float())


def test_a_full_disk_stops_the_cache_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DRAFTSMITH_FAILPOINTS", "train.cache.write=fire@2")
    monkeypatch.setattr("tasks.failpoints._reached", {})
    cache = StateCache(tmp_path / "cache", GB, "bfloat16", {})
    states = RowStates(torch.randn(4, 3 * H).bfloat16(), torch.randn(4, H).bfloat16())
    with caplog.at_level(logging.WARNING, logger="tasks.draft.states"):
        for i in range(4):
            assert cache.put(rows_named(f"r{i}")[f"r{i}"], states)["aux"].shape == (4, 3 * H)  # every row comes back
    assert cache.full and len(cache.entries) == 1 and "the disk is full" in caplog.text
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([*cache.entries, "settings.json"])
    # Another OSError is not a full disk: it is raised.
    monkeypatch.setenv("DRAFTSMITH_FAILPOINTS", "train.cache.write=fire@1")
    monkeypatch.setattr("tasks.failpoints._reached", {})

    def denied():
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr("tasks.draft.states._raise_disk_full", denied)
    with pytest.raises(OSError, match="Permission denied"):
        StateCache(tmp_path / "other", GB, "bfloat16", {}).put(rows_named("r")["r"], states)


def test_fire_failpoints_call_their_action_at_the_named_reach(monkeypatch):
    calls = []
    monkeypatch.setattr("tasks.failpoints._reached", {})
    monkeypatch.setenv("DRAFTSMITH_FAILPOINTS", "a=fire@2,b=fire@2+")
    for _ in range(4):
        failpoint("a", on_fire=lambda: calls.append("a"))
        failpoint("b", on_fire=lambda: calls.append("b"))
    assert calls == ["a", "b", "b", "b"]


def test_plan_states_prints_the_line_for_any_width_and_names_a_missing_merge(run, tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    config = tmp_path / "run.yaml"
    config.write_text(f"name: {run.name}\nruns_dir: {run.parent}\n")
    shown = CliRunner().invoke(app, ["plan-states", "--config", str(config), "--hidden-size", str(KIMI_K25_HIDDEN)])
    assert shown.exit_code == 0, shown.output
    assert f"{merged_tokens(run) * 57_344:,} B" in shown.output and "H = 7,168" in shown.output
    config.write_text(f"name: nothing-merged\nruns_dir: {tmp_path}\n")
    missing = CliRunner().invoke(app, ["plan-states", "--config", str(config)])
    assert missing.exit_code == 2 and "run the merge stage first" in missing.output
