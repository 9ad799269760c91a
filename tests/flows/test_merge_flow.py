"""The merge flow under Prefect: merges, gates, publishes the mix report, and reruns as a no-op."""

from flows.merge import merge_flow
from tasks.config import MergeConfig, MergeSourceConfig, RunConfig
from tests.tasks.test_merge import plain_sources, write_rows


def test_merge_flow_gates_and_reruns(tmp_path, demo_tokenizer, prefect_harness):
    config = RunConfig(
        name="flow",
        runs_dir=tmp_path,
        merge=MergeConfig(
            eval_size=0.2,
            rows_per_shard=10,
            sources=[MergeSourceConfig(name="chat", weight=2), MergeSourceConfig(name="code", weight=1)],
        ),
    )
    write_rows(config.run_dir, plain_sources(demo_tokenizer, {"chat": 20, "code": 15}))

    first = merge_flow(config)
    assert first["train_rows"] + first["eval_rows"] == 30 and first["gated_rows"] == 30
    assert first["eval_rows"] == 6 and first["skipped"] is False
    assert merge_flow(config)["skipped"] is True
    assert (config.run_dir / "merged" / "manifest.json").is_file()
