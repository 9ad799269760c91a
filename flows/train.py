"""Train flow: train the EAGLE-3 draft, gate its metrics, export it for SGLang/vLLM."""

from prefect import flow

from tasks.config import RunConfig
from tasks.draft.stage import export_task, gate_train_task, train_task
from tasks.target.preflight import preflight_task


@flow(name="train", log_prints=True)
def train_flow(config: RunConfig) -> dict:
    preflight_task(config.target)
    summary = train_task(config)
    gate = gate_train_task(config)
    export = export_task(config)
    return {
        "steps": summary["step"],
        "tokens_per_s": summary["tokens_per_s"],
        "draft_vocab_size": summary["draft_vocab_size"],
        "loss": gate["loss"],
        "acc_0": gate["acc_0"],
        "metrics": str(config.run_dir / "draft" / "metrics.jsonl"),
        "export": export,
    }
