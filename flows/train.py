"""Train flow: train the EAGLE-3 draft, gate its metrics, export it for SGLang/vLLM."""

from prefect import flow

from tasks.config import RunConfig
from tasks.draft.stage import export_task, gate_train_task, stage_summary, train_task
from tasks.run_lock import holds_run_lock
from tasks.stages import run_name
from tasks.target_model.preflight import stage_preflight


@flow(name="train", flow_run_name=run_name("train"), log_prints=True)
@holds_run_lock
def train_flow(config: RunConfig, force: bool = False) -> dict:
    """Train the draft (force: from scratch, not from the last checkpoint), gate its metrics, export it."""
    stage_preflight(config.target)
    trained = train_task(config, force)
    gate = gate_train_task(config)
    return stage_summary(config, trained, gate, export_task(config))
