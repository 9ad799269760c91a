"""The task runners a pipeline run gives its stages."""

import pytest
from prefect.task_runners import ThreadPoolTaskRunner

from tasks.config import OrchestrationConfig
from tasks.runners import pipeline_runners


def test_threads_and_a_given_cluster_address_are_used_as_configured(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    with pipeline_runners(OrchestrationConfig(max_workers=3)) as runner:
        assert all(isinstance(runner(sharded), ThreadPoolTaskRunner) for sharded in (True, False))
    given = OrchestrationConfig(task_runner="dask", cluster_address="tcp://127.0.0.1:8786")
    with pipeline_runners(given) as runner:
        assert runner(True).address == runner(False).address == "tcp://127.0.0.1:8786"


def test_the_sharded_stages_of_a_run_share_one_local_cluster_closed_with_the_run(monkeypatch):
    from distributed import Client

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")  # worker processes report to a server
    with pipeline_runners(OrchestrationConfig(task_runner="dask", max_workers=1)) as runner:
        assert runner(False).address is None  # a stage without shards starts no cluster
        first, second = runner(True), runner(True)
        assert first.address == second.address is not None
        with Client(first.address, timeout=30) as client:
            assert len(client.scheduler_info()["workers"]) == 1
    with pytest.raises(OSError):  # closed with the run: nothing answers at its address
        Client(first.address, timeout=2)
