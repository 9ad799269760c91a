import pyarrow as pa
import pytest

from tasks.contracts import ContractError, to_table
from tasks.storage import atomic_path, read_table, write_table


def row(**overrides):
    base = {
        "id": "a",
        "source": "s",
        "split": "train",
        "input_ids": [1, 2, 3],
        "loss_mask": [0, 1, 1],
        "num_tokens": 3,
    }
    return base | overrides


def test_round_trip(tmp_path):
    path = write_table("merged", [row(), row(id="b")], tmp_path / "part-00000.parquet")
    table = read_table("merged", tmp_path)
    assert table.column("id").to_pylist() == ["a", "b"]
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert path.exists() and not list(tmp_path.glob(".*tmp"))


def test_bad_cell_names_row_and_column():
    with pytest.raises(ContractError) as err:
        to_table("merged", [row(), row(id="b", num_tokens="many")])
    message = str(err.value)
    assert "row 1" in message and "id='b'" in message and "'num_tokens'" in message


def test_missing_column_rejected(tmp_path):
    table = pa.table({"id": ["a"], "source": ["s"]})
    with pytest.raises(ContractError, match=r"missing column\(s\) \['split'"):
        write_table("merged", table, tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()


def test_uncastable_column_rejected(tmp_path):
    good = to_table("merged", [row()])
    bad = good.set_column(5, "num_tokens", pa.array(["three"]))
    with pytest.raises(ContractError, match="column 'num_tokens' has type string, expected int32"):
        write_table("merged", bad, tmp_path / "x.parquet")


def test_unexpected_column_rejected(tmp_path):
    table = to_table("merged", [row()]).append_column("extra", pa.array([1]))
    with pytest.raises(ContractError, match=r"unexpected column\(s\) \['extra'\]"):
        write_table("merged", table, tmp_path / "x.parquet")


def test_failed_write_leaves_nothing_behind(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_a_generations_file_from_before_the_later_columns_still_reads(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.contracts import LATER_COLUMNS, schema
    from tasks.storage import read_table

    old = schema("generations")
    for column in LATER_COLUMNS["generations"]:
        old = old.remove(old.get_field_index(column))
    path = tmp_path / "part-00000.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "content": "hi"}], schema=old), path)
    assert read_table("generations", path).column("template_kwargs").to_pylist() == [None]
    assert read_table("generations", tmp_path, columns=["id", "template_kwargs"]).to_pylist() == [
        {"id": "a", "template_kwargs": None}
    ]
