"""The hidden_states gate: measure the stored shards (not what was meant to be written) per row and per shard."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.compute as pc
import torch
from prefect import task

from tasks.config import RunConfig
from tasks.extract.plan import read_merged
from tasks.extract.shards import read_shard
from tasks.gates import GateResult, enforce
from tasks.stages import stage_dir
from tasks.storage import read_table

SUITE = "hidden_states"
STATES = ("norm_aux_0", "norm_aux_1", "norm_aux_2", "norm_final")
CHUNK_TOKENS = 8192  # tokens converted to fp32 at a time while measuring


def measure_shard(path: Path, spans: list[tuple[int, int]]) -> tuple[dict, list[int], int]:
    """(mean L2 norm per state over the shard, non-finite tokens per span, tokens stored)."""
    aux, final = read_shard(path)  # (T, 3*H), (T, H)
    tokens, hidden = final.shape
    if aux.shape != (tokens, 3 * hidden):
        raise ValueError(f"{path.name}: aux has shape {tuple(aux.shape)}, expected ({tokens}, {3 * hidden})")
    norm_sums = torch.zeros(4, dtype=torch.float64)
    bad = torch.zeros(tokens, dtype=torch.int64)  # 1 where any value of the token is NaN/Inf
    for start in range(0, tokens, CHUNK_TOKENS):
        a = aux[start : start + CHUNK_TOKENS].float().view(-1, 3, hidden)  # (t, 3, H)
        f = final[start : start + CHUNK_TOKENS].float().unsqueeze(1)  # (t, 1, H)
        states = torch.cat([a, f], dim=1)  # (t, 4, H)
        finite = torch.isfinite(states).all(dim=-1).all(dim=-1)  # (t,)
        bad[start : start + len(finite)] = (~finite).long()
        norm_sums += states.norm(dim=-1).double().sum(dim=0)  # NaN propagates: the shard mean is then NaN
    means = (norm_sums / max(tokens, 1)).tolist()
    per_span = [int(bad[o : o + n].sum()) if o + n <= tokens else n for o, n in spans]
    return dict(zip(STATES, means, strict=True)), per_span, tokens


def gate_frame(config: RunConfig) -> pd.DataFrame:
    """One scalar row per merged or indexed id: accounted once, lengths, finiteness, its shard's norms."""
    out = stage_dir(config, "extract")
    merged = read_merged(config).select(["id", "split", "input_ids"])
    merged_frame = pd.DataFrame(
        {
            "id": merged.column("id").to_pylist(),
            "merged_split": merged.column("split").to_pylist(),
            "input_len": pc.list_value_length(merged.column("input_ids")).to_pylist(),
        }
    )
    index = read_table("hidden_index", out / "index.parquet").drop_columns(["input_ids"])
    frame = index.to_pandas()
    frame["index_ids_len"] = pc.list_value_length(read_table("hidden_index", out / "index.parquet", ["input_ids"]).column(0))
    frame["mask_len"] = pc.list_value_length(index.column("loss_mask")).to_numpy()
    frame = frame.drop(columns=["loss_mask"])
    frame["nonfinite_tokens"] = 0
    frame["within_shard"] = True
    for state in STATES:
        frame[state] = float("nan")
    for shard, rows in frame.groupby("shard", sort=True):
        path = out / shard
        if not path.exists():
            frame.loc[rows.index, "within_shard"] = False
            frame.loc[rows.index, "nonfinite_tokens"] = rows["length"]
            continue
        spans = list(zip(rows["offset"].tolist(), rows["length"].tolist(), strict=True))
        norms, bad, tokens = measure_shard(path, spans)
        frame.loc[rows.index, "nonfinite_tokens"] = bad
        frame.loc[rows.index, "within_shard"] = [(o + n) <= tokens for o, n in spans]
        for state, value in norms.items():
            frame.loc[rows.index, state] = value
    frame["stored"] = frame.groupby("id")["id"].transform("size")
    frame = frame.drop_duplicates("id")
    quarantined = set(read_table("quarantine", out / "quarantine.parquet", ["id"]).column(0).to_pylist())
    both = merged_frame.merge(frame, on="id", how="outer", indicator=True)
    both["in_merged"] = (both["_merge"] != "right_only").astype(int)
    both["stored"] = both["stored"].fillna(0).astype(int)
    both["quarantined"] = both["id"].isin(quarantined).astype(int)
    both["accounted"] = both["stored"] + both["quarantined"]
    stored = both["_merge"] == "both"
    both["length_ok"] = pd.Series(pd.NA, index=both.index, dtype="boolean")
    both.loc[stored, "length_ok"] = (
        (both.loc[stored, "length"] == both.loc[stored, "input_len"])
        & (both.loc[stored, "index_ids_len"] == both.loc[stored, "length"])
        & (both.loc[stored, "mask_len"] == both.loc[stored, "length"])
        & (both.loc[stored, "split"] == both.loc[stored, "merged_split"])
    )
    columns = ["id", "in_merged", "stored", "quarantined", "accounted", "length", "length_ok"]
    columns += ["within_shard", "nonfinite_tokens", *STATES]
    return both[columns].reset_index(drop=True)


def gate_extract(config: RunConfig) -> GateResult:
    """Enforce `expectations/hidden_states.json` on the stored shards and index."""
    low, high = config.extract.norm_range
    return enforce(SUITE, gate_frame(config), parameters={"min_norm": low, "max_norm": high})


@task(name="gate-extract")
def gate_task(config: RunConfig) -> dict:
    result = gate_extract(config)
    return {"rows": result.rows, "expectations": result.evaluated}
