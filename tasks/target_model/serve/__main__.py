"""`python -m tasks.target_model.serve --config RUN.yaml --port N`: what the embedded server runs as a child process."""

from __future__ import annotations

import argparse

import tasks  # noqa: F401  (offline defaults)
from tasks.config import load_config
from tasks.target_model.serve.server import serve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="run config YAML (its target and generate.api sections)")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    config = load_config(args.config)
    server = config.generate.embedded
    serve(config, args.port, server.threads, server.max_batch, config.compute.dtype)


if __name__ == "__main__":
    main()
