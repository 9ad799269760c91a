"""draftsmith Prefect flows: orchestration only."""

import tasks  # noqa: F401  (applies the offline environment before Prefect is imported)
