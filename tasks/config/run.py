"""The run: shared compute, the vLLM server, orchestration, and `RunConfig` composing every section."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from tasks.config.base import StrictModel
from tasks.config.evaluate import EvaluateConfig
from tasks.config.extract import ExtractConfig
from tasks.config.generate import GenerateConfig
from tasks.config.merge import MergeConfig
from tasks.config.reconstruct import ReconstructConfig
from tasks.config.target import TargetConfig
from tasks.config.train import TrainConfig
from tasks.config.validation import ValidationConfig


class ComputeConfig(StrictModel):
    """Where and how the models run, shared by every stage that runs one."""

    device: str = "auto"
    """auto = CUDA when present, else CPU; or cpu, cuda, cuda:1 (extract, train, evaluate)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Target compute dtype (extract, embedded server); hidden states are stored in bf16 either way. auto = bf16 on
    CUDA or a CPU with native bf16, else fp32 (emulated bf16 on an AVX2-only CPU ran ~5x slower than fp32)."""
    seed: int = 0
    """Seed of the merge shuffle and split, the draft's initialisation and its batch order."""


class VllmConfig(StrictModel):
    """The vLLM server draftsmith starts for `extract.backend: vllm` and `evaluate.engine: vllm` (127.0.0.1 only)."""

    python: str | None = None
    """Python of an environment with vLLM installed; None = $DRAFTSMITH_VLLM_PYTHON (`make test-vllm` sets up one)."""
    args: list[str] = Field(default_factory=list)
    """More server arguments, e.g. ["--tensor-parallel-size", "8"]; the model, port and dtype come from this config."""
    startup_s: float = Field(900, gt=0)
    """Seconds to wait for /health (a first start compiles the model: minutes on CPU)."""
    cpu_kvcache_gib: int = Field(2, gt=0)
    """KV cache of vLLM's CPU build, GiB (VLLM_CPU_KVCACHE_SPACE); not used on GPUs."""
    concurrency: int = Field(8, gt=0)
    """Requests in flight at once while extracting (vLLM batches them)."""


class OrchestrationConfig(StrictModel):
    # Read by `draftsmith deploy` and the worker, never by a run: left out of the deployments' run form.
    DEPLOY_ONLY: ClassVar[tuple[str, ...]] = ("schedule_cron", "schedule_timezone", "work_pool")

    task_runner: Literal["threads", "dask", "ray"] = "threads"
    """Task runner: threads on one machine; dask or ray spread shards over a cluster."""
    max_workers: int = Field(2, gt=0)
    """Worker threads/processes for the runner."""
    cluster_address: str | None = None
    """Address of an existing Dask scheduler or Ray cluster; None starts a local one."""
    schedule_cron: str | None = None
    """Cron schedule for `draftsmith deploy`; None registers without a schedule."""
    schedule_timezone: str = "UTC"
    """Time zone the cron schedule is read in (IANA name, e.g. Europe/Paris)."""
    work_pool: str = "draftsmith"
    """Prefect work pool (type process) the deployments are registered on; `draftsmith deploy` creates it, and
    `draftsmith worker` (or `prefect worker start --pool NAME`) runs its flow runs."""


class RunConfig(StrictModel):
    """Everything one pipeline run needs."""

    name: str = "demo"
    """The run's name: outputs go to runs_dir/name/, and its Prefect runs are named and tagged with it."""
    runs_dir: Path = Path("runs")
    """Runs live under runs_dir/name/."""
    target: TargetConfig = Field(default_factory=TargetConfig)
    """The target model: tokenizer, chat format, weights."""
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
    """Stage 1: buy the target's replies over the chat API."""
    reconstruct: ReconstructConfig = Field(default_factory=ReconstructConfig)
    """Stage 2: rebuild the exact token ids of every reply."""
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    """Stage 3: how far the rebuilt ids can be trusted, per source."""
    merge: MergeConfig = Field(default_factory=MergeConfig)
    """Stage 4: dedup, mix and split into train/eval shards."""
    extract: ExtractConfig = Field(default_factory=ExtractConfig)
    """Stage 5: the target's hidden states for every merged row."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """Stage 6: train the EAGLE-3 draft."""
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    """Stage 7: acceptance length of the draft on held-out prompts."""
    compute: ComputeConfig = Field(default_factory=ComputeConfig)
    """Device, dtype and seed shared by every stage that runs a model or shuffles."""
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    """The vLLM server used where extract or evaluate run on vLLM."""
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)
    """Task runner and schedule."""

    @property
    def run_dir(self) -> Path:
        return self.runs_dir / self.name
