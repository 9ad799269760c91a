"""The deployments `draftsmith deploy` builds, read without a server: the run form's order, the schedule's time zone."""

from flows.deploy import build_deployments
from tasks.config import RunConfig


def config(**orchestration) -> RunConfig:
    return RunConfig.model_validate({"name": "x", "orchestration": orchestration})


def test_the_run_form_puts_force_before_the_config():
    """The UI's form lists parameters by `position`; the config unfolds into every key of every section, so `force`
    (rerun a stage) must come first to be seen."""
    deployments = build_deployments(config())
    with_force = 0
    for deployment in deployments:
        properties = deployment._parameter_openapi_schema.properties
        shown = sorted(properties, key=lambda name: properties[name]["position"])
        assert shown == list(properties) == ["force", "config"][2 - len(properties) :], deployment.name
        with_force += "force" in properties
    assert deployments[0].name == "x" and "force" in deployments[0]._parameter_openapi_schema.properties
    assert with_force >= 2


def test_the_pipeline_s_description_names_the_schedule_s_time_zone():
    [pipeline, *stages] = build_deployments(config(schedule_cron="0 3 * * *", schedule_timezone="Europe/Paris"))
    [schedule] = pipeline.schedules
    assert (schedule.schedule.cron, schedule.schedule.timezone) == ("0 3 * * *", "Europe/Paris")
    assert "`0 3 * * *` in time zone Europe/Paris" in pipeline.description
    unscheduled = build_deployments(config())[0]
    assert not unscheduled.schedules and "time zone" not in unscheduled.description
