"""Plots as Prefect artifacts: the PNG travels inside the markdown as a data URI, so the UI shows it
without any file server."""

from __future__ import annotations

import base64
from pathlib import Path


def image_markdown(png: Path, title: str) -> str:
    encoded = base64.b64encode(Path(png).read_bytes()).decode("ascii")
    return f"# {title}\n\n![{title}](data:image/png;base64,{encoded})\n\nfile: `{png}`"


def publish_image(key: str, png: Path, title: str) -> None:
    """A markdown artifact showing `png` (a plot of at most a few hundred KB)."""
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(key=key, markdown=image_markdown(png, title), description=title)
