"""The merged gate: a scalar frame read back from the written shards, checked by `expectations/merged.json`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.gates import GateResult, enforce
from tasks.merge.hashing import hash_token_lists, list_sums
from tasks.merge.manifest import read_manifest

SUITE = "merged"
READ_COLUMNS = ["id", "source", "split", "input_ids", "loss_mask", "num_tokens", "num_trained"]


def merged_frame(directory: Path, manifest: dict) -> pd.DataFrame:
    """One scalar row per merged row (lengths, mask sums, a sequence digest, share error), read from disk."""
    parts = []
    for split in ("train", "eval"):
        for name in manifest["splits"][split]["shards"]:
            for batch in pq.ParquetFile(Path(directory) / split / name).iter_batches(columns=READ_COLUMNS):
                parts.append(
                    pd.DataFrame(
                        {
                            "id": batch.column("id").to_pandas(),
                            "source": batch.column("source").to_pandas(),
                            "split": batch.column("split").to_pandas(),
                            "is_eval": pc.equal(batch.column("split"), "eval").to_numpy(zero_copy_only=False).astype(int),
                            "num_tokens": batch.column("num_tokens").to_numpy(),
                            "num_trained": batch.column("num_trained").to_numpy(),
                            "ids_length": pc.list_value_length(batch.column("input_ids")).to_numpy(zero_copy_only=False),
                            "mask_length": pc.list_value_length(batch.column("loss_mask")).to_numpy(zero_copy_only=False),
                            "mask_sum": list_sums(batch.column("loss_mask")),
                            "sequence_digest": hash_token_lists(batch.column("input_ids")).view(np.int64),
                        }
                    )
                )
    columns = [
        "id",
        "source",
        "split",
        "is_eval",
        "num_tokens",
        "num_trained",
        "ids_length",
        "mask_length",
        "mask_sum",
        "sequence_digest",
    ]
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
    frame["share_error"] = share_errors(frame["source"], manifest["mix"])
    return frame


def share_errors(source: pd.Series, mix: dict) -> np.ndarray:
    """|realised - requested| share per row's source, among weighted sources; 0 for unweighted ones."""
    requested = {name: m["requested_share"] for name, m in mix.items() if m["requested_share"] is not None}
    counts = source.value_counts()
    weighted_total = sum(int(counts.get(name, 0)) for name in requested)
    error = {
        name: abs(int(counts.get(name, 0)) / weighted_total - share) if weighted_total else share
        for name, share in requested.items()
    }
    return source.map(error).fillna(0.0).to_numpy(dtype=float)


def gate_parameters(manifest: dict, share_tolerance: float) -> dict:
    return {
        "total_rows": manifest["expected"]["total_rows"],
        "eval_rows": manifest["expected"]["eval_rows"],
        "share_tolerance": share_tolerance,
    }


def gate_merged(directory: Path, share_tolerance: float) -> GateResult:
    """Run the `merged` suite over what is on disk; raises GateError naming what failed."""
    manifest = read_manifest(directory)
    if manifest is None:
        raise FileNotFoundError(f"{directory}: no manifest.json; run the merge first")
    frame = merged_frame(directory, manifest)
    return enforce(SUITE, frame, parameters=gate_parameters(manifest, share_tolerance))
