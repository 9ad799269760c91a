"""Task runners: threads on one machine, Dask or Ray to spread shard tasks over a cluster."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tasks.config import OrchestrationConfig

DASK_MISSING = "orchestration.task_runner=dask needs `pip install 'draftsmith[dask]'`"


class RunnerError(RuntimeError):
    """The configured task runner cannot be built here (its integration package is missing)."""


def build_task_runner(cfg: OrchestrationConfig):
    """The Prefect task runner named by `orchestration.task_runner`."""
    if cfg.task_runner == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=cfg.max_workers)
    if cfg.task_runner == "dask":
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError as e:
            raise RunnerError(DASK_MISSING) from e
        if cfg.cluster_address:
            return DaskTaskRunner(address=cfg.cluster_address)
        if os.environ.get("PREFECT_API_URL"):
            # Worker processes keep torch-heavy shards from fighting over the GIL; they report
            # to the configured Prefect server.
            return DaskTaskRunner(cluster_kwargs={"n_workers": cfg.max_workers, "threads_per_worker": 1})
        # With the temporary local API, worker processes would each start their own and their task
        # runs would be lost to the UI: keep the local cluster's workers in this process.
        return DaskTaskRunner(cluster_kwargs={"n_workers": 1, "threads_per_worker": cfg.max_workers, "processes": False})
    try:
        from prefect_ray import RayTaskRunner
    except ImportError as e:
        raise RunnerError("orchestration.task_runner=ray needs `pip install 'draftsmith[ray]'`") from e
    return RayTaskRunner(address=cfg.cluster_address) if cfg.cluster_address else RayTaskRunner()


@contextmanager
def pipeline_runners(cfg: OrchestrationConfig) -> Iterator[Callable[[bool], object]]:
    """Each stage's task runner for one pipeline run: `runner(sharded)`. On Dask with no `cluster_address`, the
    sharded stages share one local cluster, started by the first of them and closed with the run. A cluster per
    stage would start worker processes that import torch and load the target again, about 30 s a stage on 2 cores."""
    shared = cfg.task_runner == "dask" and not cfg.cluster_address and os.environ.get("PREFECT_API_URL")
    cluster = None

    def runner(sharded: bool):
        nonlocal cluster
        if not (sharded and shared):
            return build_task_runner(cfg)
        if cluster is None:
            try:
                from distributed import LocalCluster
            except ImportError as e:
                raise RunnerError(DASK_MISSING) from e
            cluster = LocalCluster(n_workers=cfg.max_workers, threads_per_worker=1)
        return build_task_runner(cfg.model_copy(update={"cluster_address": cluster.scheduler_address}))

    try:
        yield runner
    finally:
        if cluster is not None:
            cluster.close()
