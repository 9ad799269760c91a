import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.reliability)


@contextmanager
def mounted_tmpfs(mount: Path, options: str):
    """A real tmpfs at `mount` with mount `options`; needs root, as CI and the dev machines have."""
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_fs(tmp_path):
    """A 256 KiB filesystem to fill up."""
    with mounted_tmpfs(tmp_path / "small", "size=256k") as mount:
        yield mount


@pytest.fixture
def readonly_fs(tmp_path):
    """A read-only filesystem (root ignores permission bits, so chmod would not do)."""
    with mounted_tmpfs(tmp_path / "ro", "ro,size=64k") as mount:
        yield mount


@pytest.fixture(scope="session")
def reliability_report():
    """The session's fault table (printed by `pytest_terminal_summary`)."""
    from tests.reliability.report import REPORT

    return REPORT


@pytest.fixture(scope="session")
def prefect_server_home(prefect_server):
    """The folder of the session's Prefect server database (which also holds every run's logs)."""
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

    database = Path(str(PREFECT_SERVER_DATABASE_CONNECTION_URL.value()).removeprefix("sqlite+aiosqlite:///"))
    assert database.is_file(), database  # a scan of a folder without the database would find nothing
    return database.parent


@pytest.fixture(scope="session")
def crash_runs(prefect_server, tmp_path_factory):
    """One uninterrupted pipeline run and one killed inside every stage in turn, then finished (several minutes)."""
    from tests.reliability.crash_chain import run_crash_chain

    return run_crash_chain(tmp_path_factory.mktemp("crash"), prefect_server)


# Tests that inject a fault without feeding the table themselves: their pass/fail is their row.
OUTCOME_ROWS = {"test_storage_faults.py": "storage faults", "test_remote_code.py": "remote code"}


def pytest_runtest_logreport(report):
    from tests.reliability.report import REPORT

    suite = OUTCOME_ROWS.get(Path(report.location[0]).name)
    if suite and report.when == "call":
        REPORT.record(suite, report.location[2].removeprefix("test_").replace("_", " "), 1, int(report.passed))
