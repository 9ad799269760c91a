"""Gates hold: a hand-off table corrupted between stages is refused by name, and the pipeline does not skip past it."""

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file, save_file

from tasks.config import load_config
from tasks.extract.checks import gate_extract
from tasks.gates import GateError, enforce
from tasks.merge.gate import gate_merged
from tasks.reconstruct.stage import gate_frame, gate_parameters
from tasks.stage_record import current_summary

pytestmark = pytest.mark.slow


@pytest.fixture
def run_copy(crash_runs, tmp_path):
    """A private copy of the uninterrupted run, and its config pointing at it."""
    shutil.copytree(crash_runs.clean_dir, tmp_path / "runs" / crash_runs.clean_dir.name)
    config = load_config(crash_runs.clean_dir.parent.parent / "clean.yaml", {"runs_dir": str(tmp_path / "runs")})
    assert current_summary(config, "reconstruct") is not None  # the copy is up to date before it is corrupted
    return config


def rewrite(path, change):
    table = pq.read_table(path)
    pq.write_table(change(table), path)


def duplicate_first_id(table: pa.Table) -> pa.Table:
    ids = table.column("id").to_pylist()
    return table.set_column(table.column_names.index("id"), "id", pa.array([ids[0], ids[0], *ids[2:]], pa.string()))


def zero_first_mask(table: pa.Table) -> pa.Table:
    masks = table.column("loss_mask").to_pylist()
    masks[0] = [0] * len(masks[0])
    column = table.column_names.index("loss_mask")
    return table.set_column(column, table.schema.field(column), pa.array(masks, table.schema.field(column).type))


def nan_in_first_token(path) -> None:
    tensors = load_file(path)
    name = sorted(tensors)[0]
    tensors[name][0, 0] = float("nan")
    save_file(tensors, path)


def refused(stage, check, config, reliability_report, kind, expectation, column):
    skipped = current_summary(config, stage) is not None
    with pytest.raises(GateError) as err:
        check()
    named = expectation in str(err.value) and repr(column) in str(err.value)
    reliability_report.record("gates hold", kind, 1, int(named and not skipped))
    assert not skipped, f"the pipeline would skip {stage} and hand the corrupted table on"
    assert named, str(err.value)


def test_duplicated_id_in_reconstructed(run_copy, reliability_report):
    (part,) = (run_copy.run_dir / "reconstructed").glob("part-*.parquet")
    rewrite(part, duplicate_first_id)
    refused(
        "reconstruct",
        lambda: enforce("reconstructed", gate_frame(run_copy), parameters=gate_parameters(run_copy)),
        run_copy,
        reliability_report,
        "duplicated id in reconstructed/",
        "expect_column_values_to_be_unique",
        "id",
    )


def test_zeroed_loss_mask_in_merged(run_copy, reliability_report):
    rewrite(run_copy.run_dir / "merged" / "train" / "part-00000.parquet", zero_first_mask)
    refused(
        "merge",
        lambda: gate_merged(run_copy.run_dir / "merged", run_copy.merge.share_tolerance),
        run_copy,
        reliability_report,
        "loss_mask zeroed in merged/",
        "expect_column_values_to_be_between",
        "mask_sum",
    )


def test_nan_in_a_hidden_state_shard(run_copy, reliability_report):
    (shard,) = (run_copy.run_dir / "hidden_states").glob("shard-*.safetensors")
    nan_in_first_token(shard)
    refused(
        "extract",
        lambda: gate_extract(run_copy),
        run_copy,
        reliability_report,
        "NaN in a hidden-state shard",
        "expect_column_values_to_be_between",
        "nonfinite_tokens",
    )
