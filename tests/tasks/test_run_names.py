"""A run name typed in a deployment's run form is kept; Prefect's random names are replaced by the config's."""

import re

from prefect import flow

from tasks.run_names import is_generated_name
from tasks.stages import run_name

TYPED = ["retrain-kimi", "nightly", "demo-after-tokenizer-fix", "kimi-k2.5 1M rows"]


def test_prefect_s_own_names_are_told_from_typed_ones():
    from prefect.utilities.names import generate_slug

    assert all(is_generated_name(generate_slug(2)) for _ in range(500))  # the server's, for a run created unnamed
    for suggested in ("tau42-vega-nebula", "alpha-canis-majoris", "omega517-barad-dur-void"):  # the run form's
        assert is_generated_name(suggested), suggested
    for typed in TYPED:
        assert not is_generated_name(typed), typed


@flow(flow_run_name=run_name("probe"))
def probe(config: dict) -> str:
    from prefect.context import FlowRunContext

    return FlowRunContext.get().flow_run.name


def test_a_deployment_run_keeps_a_typed_name_and_renames_a_random_one(prefect_harness):
    """Runs created from a deployment as the UI and `prefect deployment run` create them, then executed by the same
    engine a worker uses: a typed name stays; an unnamed run, the form's suggestion and a direct call get the
    config's name."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow

    config = {"name": "x"}
    with get_client(sync_client=True) as client:
        deployment_id = client.create_deployment(flow_id=client.create_flow(probe), name="probe-names")

        def run_from_deployment(name: str | None) -> str:
            created = client.create_flow_run_from_deployment(deployment_id, parameters={"config": config}, name=name)
            return run_flow(probe, flow_run=created, parameters={"config": config})

        generated = re.compile(r"x-probe-\d{4}-\d{6}")
        assert run_from_deployment("retrain-kimi") == "retrain-kimi"
        assert generated.fullmatch(run_from_deployment(None))
        assert generated.fullmatch(run_from_deployment("tau42-vega-nebula"))
    assert generated.fullmatch(probe(config))
