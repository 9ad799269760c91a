"""Draft training on real demo-target hidden states: overfit, resume, online mode, DDP."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from tasks.config import RunConfig
from tasks.draft.data import OfflineSource, OnlineSource, plan_batches
from tasks.draft.stage import gate_train, launch_torchrun, train_stage
from tasks.draft.train import pieces_from_model, train_draft
from tasks.gates import GateError
from tests.tasks.draft_fixture import AUX_LAYER_IDS, write_run

torch.set_num_threads(1)

TINY = {
    "draft_vocab_size": 512,
    "ttt_steps": 3,
    "batch_tokens": 256,
    "lr": 3e-3,
    "warmup_steps": 2,
    "max_steps": 8,
    "checkpoint_every": 3,
    "draft_overrides": {"intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1},
}


@pytest.fixture(scope="session")
def hidden_run(tmp_path_factory, demo_tokenizer, demo_model):
    """A run directory with merged rows and hidden-state shards of the demo target."""
    return write_run(tmp_path_factory.mktemp("draft-run") / "fixture", demo_tokenizer, demo_model)


def config_for(run_dir, tmp_path, name, **train) -> RunConfig:
    """A run under tmp_path sharing the fixture's merged rows and hidden states."""
    target = tmp_path / name
    target.mkdir(parents=True, exist_ok=True)
    for sub in ("merged", "hidden_states"):
        if not (target / sub).exists():
            (target / sub).symlink_to(run_dir / sub)
    return RunConfig.model_validate({"name": name, "runs_dir": str(tmp_path), "train": TINY | train})


def final_weights(config: RunConfig) -> dict:
    found = sorted((config.run_dir / "draft" / "checkpoints").glob("step-*.pt"))
    return torch.load(found[-1], weights_only=False)["model"]


def test_epoch_batches_take_every_row_once_within_budget_and_little_padding():
    rng = torch.Generator().manual_seed(0)
    lengths = (torch.empty(2000).log_normal_(6.0, 0.6, generator=rng).clamp(20, 1000)).int().tolist()  # reply-like
    epoch0 = plan_batches(lengths, 1024, seed=7, epoch=0)
    assert epoch0 == plan_batches(lengths, 1024, seed=7, epoch=0)
    assert epoch0 != plan_batches(lengths, 1024, seed=7, epoch=1)
    assert sorted(i for batch in epoch0 for i in batch) == list(range(len(lengths)))
    assert all(len(batch) == 1 or sum(lengths[i] for i in batch) <= 1024 for batch in epoch0)
    padded = sum(len(batch) * max(lengths[i] for i in batch) for batch in epoch0)
    unsorted = plan_batches(lengths, 1024, seed=7, epoch=0, window=1)  # packed in shuffled order only
    assert padded < 1.1 * sum(lengths) < sum(len(b) * max(lengths[i] for i in b) for b in unsorted)


def test_loss_falls_on_tiny_overfit(hidden_run, tmp_path, demo_model):
    config = config_for(hidden_run, tmp_path, "overfit", max_steps=16)
    summary = train_stage(config, pieces_from_model(demo_model, keep_model=False))
    assert summary["step"] == 16 and summary["tokens_per_s"] > 0
    records = [json.loads(line) for line in (config.run_dir / "draft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 17))
    assert {f"{name}_{i}" for name in ("acc", "loss") for i in range(3)} | {f"acc_{i}_all" for i in range(3)} <= set(records[0])
    assert all(r[f"acc_{i}_all"] <= r[f"acc_{i}"] for r in records for i in range(3))  # out-of-vocab count as misses
    first, last = sum(r["loss"] for r in records[:4]) / 4, sum(r["loss"] for r in records[-4:]) / 4
    assert last < 0.6 * first
    assert sum(r["acc_0"] for r in records[-4:]) > sum(r["acc_0"] for r in records[:4])
    assert (config.run_dir / "draft" / "curves.png").stat().st_size > 10_000
    gate = gate_train(config)
    assert gate["loss_drop"] > 0 and set(gate) >= {"acc_0", "acc_1", "acc_2"}
    # The gate can fail: a loss that rises is refused.
    path = config.run_dir / "draft" / "metrics.jsonl"
    path.write_text("".join(json.dumps(r | {"loss": float(r["step"])}) + "\n" for r in records))
    with pytest.raises(GateError, match="loss_drop"):
        gate_train(config)
    # ...and so is a first-step accuracy that falls while the loss falls.
    path.write_text("".join(json.dumps(r | {"acc_0": 1.0 / r["step"]}) + "\n" for r in records))
    with pytest.raises(GateError, match="acc_0_rise"):
        gate_train(config)


def test_resume_equals_uninterrupted(hidden_run, tmp_path, demo_model):
    pieces = pieces_from_model(demo_model, keep_model=False)
    straight = config_for(hidden_run, tmp_path, "straight")
    train_draft(straight, pieces)
    interrupted = config_for(hidden_run, tmp_path, "interrupted")
    assert train_draft(interrupted, pieces, until_step=5)["step"] == 5  # stops mid-epoch, between checkpoints
    assert train_draft(interrupted, pieces)["step"] == 8  # resumes from step 5
    a, b = final_weights(straight), final_weights(interrupted)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    metrics = (interrupted.run_dir / "draft" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(m)["step"] for m in metrics] == list(range(1, 9))
    # A finished run is a no-op.
    assert train_draft(interrupted, pieces)["tokens_per_s"] is None


def test_auto_dtype_trains_as_the_hardware_resolves_it(hidden_run, tmp_path, demo_model):
    from tasks.target_model.loader import resolve_dtype

    pieces = pieces_from_model(demo_model, keep_model=False)
    weights = {}
    for dtype in ("float32", "bfloat16", "auto"):
        config = config_for(hidden_run, tmp_path, f"dtype-{dtype}", dtype=dtype, max_steps=2, checkpoint_every=2)
        train_draft(config, pieces)
        weights[dtype] = final_weights(config)["fc.weight"]
    assert not torch.equal(weights["float32"], weights["bfloat16"])  # bf16 matmuls change the update
    torch.testing.assert_close(weights["auto"], weights[resolve_dtype("auto")], rtol=0, atol=0)


def test_online_reads_the_same_features(hidden_run, tmp_path, demo_model):
    offline = OfflineSource(hidden_run, "train")
    online = OnlineSource(hidden_run, demo_model, AUX_LAYER_IDS, "train")
    assert [r.id for r in online.rows] == [r.id for r in offline.rows]
    a, b = offline.features([0])[0], online.features([0])[0]
    for key in ("aux", "final"):  # offline is stored in bf16
        torch.testing.assert_close(a[key], b[key], rtol=2e-2, atol=2e-2)
    # One padded forward over rows of different lengths gives each row its own states, no padding attached.
    rows = sorted(range(len(online.rows)), key=lambda i: len(online.rows[i].input_ids))[:: len(online.rows) // 3][:3]
    assert len({len(online.rows[i].input_ids) for i in rows}) == 3
    for i, together in zip(rows, online.features(rows), strict=True):
        alone = online.features([i])[0]
        assert together["aux"].shape == alone["aux"].shape == (len(online.rows[i].input_ids), 3 * 576)
        for key in ("aux", "final"):
            torch.testing.assert_close(together[key], alone[key], rtol=1e-4, atol=1e-4)
    config = config_for(hidden_run, tmp_path, "online", hidden_states="online", max_steps=2)
    shutil.rmtree(config.run_dir / "hidden_states", ignore_errors=True)
    (config.run_dir / "hidden_states").unlink(missing_ok=True)
    summary = train_draft(config, pieces_from_model(demo_model, keep_model=True))
    assert summary["step"] == 2 and summary["aux_layer_ids"] == [2, 15, 27]
    from tasks.draft.stage import export_stage  # an online run has no extract stage: the export still finds the target

    exported = json.loads((Path(export_stage(config)) / "config.json").read_text())
    assert exported["architectures"] == ["LlamaForCausalLMEagle3"] and exported["num_hidden_layers"] == 1


@pytest.mark.slow
def test_two_ranks_match_one_rank_with_doubled_batch(hidden_run, tmp_path, demo_model):
    one = config_for(hidden_run, tmp_path, "one-rank", max_steps=3, batch_tokens=512)
    train_draft(one, pieces_from_model(demo_model, keep_model=False))
    two = config_for(hidden_run, tmp_path, "two-ranks", max_steps=3, batch_tokens=256, processes=2)
    summary = launch_torchrun(two)
    assert summary["step"] == 3
    a, b = final_weights(one), final_weights(two)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)
