"""The project's own shape: no folder named as build output (a standard .gitignore would drop it from every commit),
and no file of stage logic or orchestration past a screen or so."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Folder names that build tools and the standard .gitignore templates claim (Python, Maven/Rust, JavaScript, CMake).
BUILD_OUTPUT = {"build", "dist", "target", "out", "bin", "obj", "node_modules", "cmake-build-debug", "site", "wheels", "eggs"}
MAX_LINES = 400


def tracked() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [Path(p) for p in listed.stdout.splitlines()]


def test_no_folder_is_named_as_build_output():
    folders = {part for path in tracked() for part in path.parts[:-1]}
    assert not folders & BUILD_OUTPUT, sorted(folders & BUILD_OUTPUT)


def test_no_stage_or_flow_module_is_over_400_lines():
    long = {
        str(path): n
        for path in tracked()
        if path.suffix == ".py" and path.parts[0] in ("tasks", "flows") and (ROOT / path).exists()
        for n in [len((ROOT / path).read_text(encoding="utf-8").splitlines())]
        if n > MAX_LINES
    }
    assert long == {}
