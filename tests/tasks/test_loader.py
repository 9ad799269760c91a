import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.target_model.loader import gguf_path

CONVERT = (
    "import sys; from pathlib import Path; from tasks.target_model.loader import convert_gguf; "
    "print(convert_gguf(Path(sys.argv[1])))"
)


@pytest.mark.slow
def test_two_processes_converting_one_gguf_at_once_both_get_the_model(tmp_path, demo_target):
    """Two workers starting on a fresh machine both convert the demo GGUF: neither may fail on the other's half-written
    folder, and one converted copy is left, with nothing partial beside it."""
    env = {**os.environ, "DRAFTSMITH_CACHE": str(tmp_path)}
    root = Path(__file__).resolve().parents[2]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONVERT, str(gguf_path(demo_target))],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    folders = {out.strip().splitlines()[-1] for out, _ in outs}
    assert len(folders) == 1
    converted = Path(folders.pop())
    assert (converted / "config.json").exists()
    assert list((tmp_path / "models").iterdir()) == [converted]
