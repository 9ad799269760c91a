"""Merge stage end to end on real SmolLM2 token ids: dedup, filters, mix, split, determinism, reruns."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from tasks.config import ComputeConfig, MergeConfig, MergeSourceConfig, RunConfig
from tasks.gates import GateError
from tasks.merge.gate import gate_merged
from tasks.merge.sources import MergeInputError
from tasks.merge.stage import MergeBudgetError, run_merge
from tasks.storage import read_table, write_table

TOPICS = {
    "chat": "Tell me about {}.",
    "code": "Write a Python function that {}.",
    "tool": "Call the weather tool for {}.",
    "heldout": "Explain {} to a child.",
}
THINGS = ["rivers", "mountains", "owls", "bridges", "tea", "clocks", "glaciers", "violins", "maps", "salt"]


def conversation(tokenizer, prompt: str, reply: str) -> tuple[list[int], list[int]]:
    """Real ChatML ids of a one-turn conversation and its loss mask (1 on the assistant reply)."""
    messages = [{"role": "user", "content": prompt}]
    head = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": reply}], tokenize=False)
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    prompt_len = len(tokenizer(head, add_special_tokens=False)["input_ids"])
    mask = [0] * prompt_len + [1] * (len(ids) - prompt_len - 1) + [0]  # the trailing "\n" is not trained
    return ids, mask


def make_row(tokenizer, source: str, index: int, prompt: str | None = None, **overrides) -> dict:
    prompt = prompt or TOPICS[source].format(f"{THINGS[index % len(THINGS)]} number {index}")
    ids, mask = conversation(tokenizer, prompt, f"Here is answer {index} for {source}: " + "word " * (index % 7))
    row = {
        "id": f"{source}-{index:04d}",
        "source": source,
        "input_ids": ids,
        "loss_mask": mask,
        "num_tokens": len(ids),
        "num_trained": sum(mask),
        "last_trained_id": ids[max(i for i, m in enumerate(mask) if m)],
        "method": "reencode",
        "round_trip": True,
        "finish_reason": "stop",
        "prompt_text": f"user: {prompt}",
    }
    return row | overrides


def write_rows(run_dir: Path, rows: list[dict], per_shard: int = 40, stage: str = "reconstructed") -> Path:
    directory = run_dir / stage
    for start in range(0, len(rows), per_shard):
        write_table(stage, rows[start : start + per_shard], directory / f"part-{start // per_shard:05d}.parquet")
    return directory


def plain_sources(tokenizer, counts: dict[str, int]) -> list[dict]:
    return [make_row(tokenizer, source, i) for source, n in counts.items() for i in range(n)]


def config_for(tmp_path: Path, name: str = "run", seed: int = 0, **merge) -> RunConfig:
    return RunConfig(name=name, runs_dir=tmp_path, merge=MergeConfig(**merge), compute=ComputeConfig(seed=seed))


def merged(config: RunConfig) -> pd.DataFrame:
    out = config.run_dir / "merged"
    return pd.concat([pd.read_parquet(out / "train"), pd.read_parquet(out / "eval")], ignore_index=True)


def quarantine(config: RunConfig) -> pd.DataFrame:
    return pd.read_parquet(config.run_dir / "merged" / "quarantine.parquet")


def manifest(config: RunConfig) -> dict:
    return json.loads((config.run_dir / "merged" / "manifest.json").read_text())


def test_dedup_within_and_across_sources(tmp_path, demo_tokenizer):
    rows = plain_sources(demo_tokenizer, {"chat": 20, "code": 20})
    first_chat = rows[3]
    rows += [
        # Same prompt as chat-0003 up to case, whitespace and a full-width letter; different reply.
        make_row(demo_tokenizer, "chat", 900, prompt="  TELL me  about   Ｂridges number 3. "),
        # A code row whose ids repeat chat-0005 exactly (cross-source sequence duplicate).
        rows[5] | {"id": "code-0777", "source": "code", "prompt_text": "user: other text"},
        # A reused id in another source.
        make_row(demo_tokenizer, "code", 555, id="chat-0001"),
    ]
    config = config_for(tmp_path, eval_size=0.0)
    write_rows(config.run_dir, rows)
    run_merge(config)

    out, dropped = merged(config), quarantine(config)
    assert out["id"].is_unique and len(out) == 40
    assert out["input_ids"].map(tuple).is_unique
    by_id = dropped.set_index("id")
    assert by_id.loc["chat-0900", "reason"] == "duplicate_prompt"
    assert first_chat["id"] in by_id.loc["chat-0900", "detail"]
    assert by_id.loc["code-0777", "reason"] == "duplicate_sequence"
    assert by_id.loc["code-0777", "field"] == "input_ids" and "chat-0005" in by_id.loc["code-0777", "detail"]
    reused = dropped[dropped["reason"] == "duplicate_id"]
    assert len(reused) == 1 and reused["source"].item() == "code"
    assert manifest(config)["drops"] == {
        "duplicate_id": {"code": 1},
        "duplicate_sequence": {"code": 1},
        "duplicate_prompt": {"chat": 1},
    }


def test_filters_quarantine_with_reasons(tmp_path, demo_tokenizer):
    rows = plain_sources(demo_tokenizer, {"chat": 24})
    long_row = make_row(demo_tokenizer, "chat", 100, prompt="Explain " + "very " * 80 + "carefully.")
    short = rows[0]
    rows += [
        long_row,
        make_row(demo_tokenizer, "chat", 101, finish_reason="length"),
        make_row(demo_tokenizer, "chat", 102)
        | {
            "loss_mask": [0] * short["num_tokens"],
            "input_ids": short["input_ids"],
            "num_tokens": short["num_tokens"],
            "prompt_text": "user: empty",
        },
        make_row(demo_tokenizer, "chat", 103) | {"num_tokens": 3},
        make_row(demo_tokenizer, "chat", 104),
        make_row(demo_tokenizer, "chat", 105),
    ]
    config = RunConfig(
        name="run",
        runs_dir=tmp_path,
        merge=MergeConfig(
            eval_size=0.0,
            sources=[
                MergeSourceConfig(
                    name="chat",
                    min_tokens=short["num_tokens"] + 1,
                    max_tokens=100,
                    allowed_classes=["exact", "bpe_only"],
                    drop_truncated=True,
                )
            ],
        ),
    )
    write_rows(config.run_dir, rows)
    validation = [{"id": r["id"], "source": "chat", "method": "reencode", "mode": "check", "klass": "exact"} for r in rows]
    by_id = {v["id"]: v for v in validation}
    by_id["chat-0104"]["klass"] = "semantic"
    del by_id["chat-0105"]  # no ground truth: unverified, not allowed here
    simulate = {"id": "chat-0104", "source": "chat", "method": "reencode", "mode": "simulate", "klass": "exact"}
    write_rows(config.run_dir, list(by_id.values()) + [simulate], stage="validation")
    run_merge(config)

    reasons = quarantine(config).set_index("id")[["reason", "field"]]
    assert reasons.loc["chat-0100"].tolist() == ["too_long", "num_tokens"]
    assert reasons.loc["chat-0101"].tolist() == ["truncated", "finish_reason"]
    assert reasons.loc["chat-0102"].tolist() == ["empty_loss_mask", "loss_mask"]
    assert reasons.loc["chat-0103"].tolist() == ["malformed", "input_ids"]
    assert reasons.loc["chat-0104"].tolist() == ["class_not_allowed", "klass"]
    assert reasons.loc["chat-0105"].tolist() == ["class_not_allowed", "klass"]
    assert reasons.loc[short["id"]].tolist() == ["too_short", "num_tokens"]
    out = merged(config)
    assert not set(reasons.index) & set(out["id"]) and len(out) == 23
    assert out["num_tokens"].between(short["num_tokens"] + 1, 100).all()


def test_weights_caps_and_realised_mix(tmp_path, demo_tokenizer):
    rows = plain_sources(demo_tokenizer, {"chat": 60, "code": 50, "tool": 30})
    sources = [
        MergeSourceConfig(name="chat", weight=3),
        MergeSourceConfig(name="code", weight=1),
        MergeSourceConfig(name="tool", max_rows=12),
    ]
    config = RunConfig(name="run", runs_dir=tmp_path, merge=MergeConfig(sources=sources, eval_size=0.0))
    write_rows(config.run_dir, rows)
    run_merge(config)

    counts = merged(config)["source"].value_counts().to_dict()
    assert counts == {"chat": 60, "code": 20, "tool": 12}  # chat is scarcest for 3:1, tool capped
    mix = manifest(config)["mix"]
    assert mix["chat"]["requested_share"] == pytest.approx(0.75) and mix["chat"]["realised_share"] == pytest.approx(0.75)
    assert mix["tool"]["requested_share"] is None and mix["tool"]["share_of_set"] == pytest.approx(12 / 92)
    left = quarantine(config)
    assert (left["reason"] == "not_sampled").sum() == 30 + 18
    assert set(left.loc[left.source == "tool", "field"]) == {"max_rows"}
    gate_merged(config.run_dir / "merged", config.merge.share_tolerance)


def test_split_is_stratified_by_source(tmp_path, demo_tokenizer):
    rows = plain_sources(demo_tokenizer, {"chat": 40, "code": 20})
    config = config_for(tmp_path, eval_size=0.25)
    write_rows(config.run_dir, rows)
    run_merge(config)
    out = merged(config)
    assert out.groupby(["source", "split"]).size().to_dict() == {
        ("chat", "eval"): 10,
        ("chat", "train"): 30,
        ("code", "eval"): 5,
        ("code", "train"): 15,
    }
    train, evaluation = (
        read_table("merged", config.run_dir / "merged" / "train"),
        pd.read_parquet(config.run_dir / "merged" / "eval"),
    )
    assert not set(train.column("id").to_pylist()) & set(evaluation["id"])
    # The train order is shuffled across sources, not source after source.
    assert train.column("source").to_pylist()[:10] != sorted(train.column("source").to_pylist()[:10])

    counted = config_for(tmp_path, name="counted", eval_size=7)
    write_rows(counted.run_dir, rows)
    run_merge(counted)
    assert merged(counted).query("split == 'eval'")["source"].value_counts().to_dict() == {"chat": 5, "code": 2}


def test_a_held_out_source_stays_the_eval_set_while_training_sources_grow(tmp_path, demo_tokenizer):
    """split eval: every row of the source is held out, the same rows whatever the training budget; split train:
    none of the source's rows is; eval_size applies to the mixed sources alone."""
    evals = []
    for budget in (20, 60):
        rows = plain_sources(demo_tokenizer, {"chat": budget, "heldout": 8, "code": 20})
        sources = [
            MergeSourceConfig(name="chat", split="train"),
            MergeSourceConfig(name="heldout", split="eval"),
            MergeSourceConfig(name="code"),
        ]
        config = config_for(tmp_path, name=f"budget{budget}", eval_size=5, sources=sources)
        write_rows(config.run_dir, rows)
        run_merge(config)
        gate_merged(config.run_dir / "merged", config.merge.share_tolerance)  # expected eval rows: held-out ones too
        out = merged(config)
        assert out.groupby(["source", "split"]).size().to_dict() == {
            ("chat", "train"): budget,
            ("code", "eval"): 5,
            ("code", "train"): 15,
            ("heldout", "eval"): 8,
        }
        evals.append(set(out.query("source == 'heldout'")["id"]))
    assert evals[0] == evals[1]


def shard_bytes(config: RunConfig) -> dict[str, bytes]:
    out = config.run_dir / "merged"
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("part-*.parquet"))}


def test_same_seed_gives_identical_bytes_whatever_the_budget(tmp_path, demo_tokenizer):
    rows = plain_sources(demo_tokenizer, {"chat": 50, "code": 40})
    runs = {
        "a": config_for(tmp_path, "a", seed=7, rows_per_shard=16),
        "b": config_for(tmp_path, "b", seed=7, rows_per_shard=16, memory_budget_mb=1),  # many buckets
        "c": config_for(tmp_path, "c", seed=8, rows_per_shard=16),
    }
    for config in runs.values():
        write_rows(config.run_dir, rows)
        run_merge(config)
    a, b, c = (shard_bytes(runs[k]) for k in "abc")
    assert len(a) == 6 + 1 and a == b
    assert a != c
    assert set(merged(runs["a"])["id"]) == set(merged(runs["c"])["id"])
    assert manifest(runs["a"])["config_hash"] == manifest(runs["b"])["config_hash"]


def test_rerun_is_a_no_op_until_inputs_change(tmp_path, demo_tokenizer):
    rows = plain_sources(demo_tokenizer, {"chat": 30, "code": 10})
    config = config_for(tmp_path, rows_per_shard=8)
    write_rows(config.run_dir, rows)
    assert run_merge(config)["skipped"] is False
    out = config.run_dir / "merged"
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()}
    assert run_merge(config)["skipped"] is True
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()} == before
    assert not [p for p in config.run_dir.iterdir() if p.name.startswith(".")]

    assert run_merge(config, force=True)["skipped"] is False
    write_rows(config.run_dir, rows + [make_row(demo_tokenizer, "code", 99)])
    summary = run_merge(config)
    assert summary["skipped"] is False and summary["train_rows"] + summary["eval_rows"] == 41


def test_shards_load_with_pandas_and_datasets(tmp_path, demo_tokenizer):
    import datasets

    rows = plain_sources(demo_tokenizer, {"chat": 20, "tool": 10})
    config = config_for(tmp_path, rows_per_shard=10)
    write_rows(config.run_dir, rows)
    run_merge(config)
    out = config.run_dir / "merged"
    loaded = datasets.load_dataset(
        "parquet",
        data_files={"train": str(out / "train" / "part-*.parquet"), "eval": str(out / "eval" / "part-*.parquet")},
        cache_dir=str(tmp_path / "hf-cache"),
    )
    assert loaded["train"].num_rows == 27 and loaded["eval"].num_rows == 3
    first = loaded["train"][0]
    source_row = next(r for r in rows if r["id"] == first["id"])
    assert first["input_ids"] == source_row["input_ids"] and first["loss_mask"] == source_row["loss_mask"]
    assert demo_tokenizer.decode(first["input_ids"]).startswith("<|im_start|>system")
    assert len(pd.read_parquet(out / "train")) == 27


def test_gate_names_duplicate_sequences_and_mix_drift(tmp_path, demo_tokenizer):
    rows = plain_sources(demo_tokenizer, {"chat": 20, "code": 20})
    config = RunConfig(
        name="run",
        runs_dir=tmp_path,
        merge=MergeConfig(
            eval_size=0.0, sources=[MergeSourceConfig(name="chat", weight=1), MergeSourceConfig(name="code", weight=1)]
        ),
    )
    write_rows(config.run_dir, rows)
    run_merge(config)
    shard = config.run_dir / "merged" / "train" / "part-00000.parquet"
    table = pq.read_table(shard)
    doubled = table.slice(0, 1).to_pylist()[0] | {"id": "copy"}
    write_table("merged", table.to_pylist() + [doubled], shard)
    with pytest.raises(GateError) as err:
        gate_merged(config.run_dir / "merged", share_tolerance=0.0)
    failed = {(f.expectation, f.column) for f in err.value.result.failures}
    assert ("expect_column_values_to_be_unique", "sequence_digest") in failed
    assert ("expect_table_row_count_to_equal", None) in failed
    assert ("expect_column_max_to_be_between", "share_error") in failed


def test_sources_by_path_and_relabel(tmp_path, demo_tokenizer):
    other = tmp_path / "older-run" / "reconstructed"
    write_rows(tmp_path / "older-run", plain_sources(demo_tokenizer, {"chat": 10}))
    config = RunConfig(
        name="run",
        runs_dir=tmp_path,
        merge=MergeConfig(
            eval_size=0.0, sources=[MergeSourceConfig(name="chat"), MergeSourceConfig(name="chat-older", path=other)]
        ),
    )
    write_rows(config.run_dir, plain_sources(demo_tokenizer, {"chat": 10, "code": 5}))
    run_merge(config)
    out = merged(config)
    assert out["source"].value_counts().to_dict() == {"chat": 10}  # the older rows repeat: dropped as duplicates
    assert manifest(config)["drops"]["duplicate_id"] == {"chat-older": 10}
    assert manifest(config)["rows"]["unrouted"] == 5

    wrong = config.model_copy(update={"merge": MergeConfig(sources=[MergeSourceConfig(name="nope")])})
    with pytest.raises(MergeInputError, match=r"'nope'.*holds \['chat', 'code'\]"):
        run_merge(wrong)


def test_memory_budget_too_small_is_refused(tmp_path, demo_tokenizer):
    base = plain_sources(demo_tokenizer, {"chat": 10})
    rows = [base[i % 10] | {"id": f"r{i}"} for i in range(8000)]
    config = config_for(tmp_path, memory_budget_mb=1)
    write_table("reconstructed", rows, config.run_dir / "reconstructed" / "part-00000.parquet")
    with pytest.raises(MergeBudgetError, match="memory_budget_mb=1"):
        run_merge(config)
    assert not (config.run_dir / "merged").exists()


def test_cut_replies_are_kept_by_default_and_counted(tmp_path, demo_tokenizer):
    """A reply cut at max_tokens is the target's own tokens: merge keeps it unless drop_truncated, and the manifest
    says how many of each source's training rows were cut."""
    rows = [make_row(demo_tokenizer, "chat", i, finish_reason="length" if i % 3 == 0 else "stop") for i in range(9)]
    config = RunConfig(name="run", runs_dir=tmp_path, merge=MergeConfig(eval_size=0.0))
    write_rows(config.run_dir, rows)
    run_merge(config)
    assert len(merged(config)) == 9 and manifest(config)["counts"]["chat"]["train_truncated"] == 3
    dropping = config.model_copy(update={"merge": MergeConfig(eval_size=0.0, sources=[{"name": "chat", "drop_truncated": True}])})
    run_merge(dropping)
    assert len(merged(dropping)) == 6 and manifest(dropping)["counts"]["chat"]["train_truncated"] == 0


def test_the_generate_summary_gives_each_sources_share_of_cut_replies():
    from tasks.generate.summary import truncated_by_source

    rows = [{"source": "a", "truncated": i < 2, "origin": "target"} for i in range(8)]
    rows += [{"source": "b", "truncated": False, "origin": "target"}, {"source": "c", "truncated": True, "origin": "dataset"}]
    expected = {"a": {"replies": 8, "cut": 2, "share": 0.25}, "b": {"replies": 1, "cut": 0, "share": 0.0}}
    assert truncated_by_source(rows) == expected
