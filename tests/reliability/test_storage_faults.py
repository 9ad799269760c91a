"""Storage faults: a full or read-only disk gives a clear error and never a partial file that looks complete."""

import errno
import random

import pytest

from tasks.storage import StorageError, atomic_path, read_table, write_table


def rows(n: int, width: int = 200):
    rng = random.Random(0)  # random ids: incompressible, like real token ids
    return [
        {
            "id": f"r{i}",
            "source": "s",
            "split": "train",
            "input_ids": [rng.randrange(49152) for _ in range(width)],
            "loss_mask": [1] * width,
            "num_tokens": width,
        }
        for i in range(n)
    ]


def test_disk_full_mid_write_leaves_no_file(small_fs):
    target = small_fs / "merged" / "part-00000.parquet"
    with pytest.raises(StorageError) as err:
        # ~2 MB of random int32 ids does not fit in 256 KiB, even compressed
        write_table("merged", rows(2500), target)
    assert err.value.errno == errno.ENOSPC
    assert str(target) in str(err.value)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []


def test_disk_full_keeps_the_previous_complete_file(small_fs):
    target = small_fs / "part-00000.parquet"
    write_table("merged", rows(3, width=10), target)
    with pytest.raises(StorageError):
        write_table("merged", rows(2500), target)
    assert read_table("merged", target).num_rows == 3


def test_read_only_output_dir_names_the_path(readonly_fs):
    target = readonly_fs / "generations" / "part-00000.parquet"
    with pytest.raises(StorageError) as err:
        write_table("merged", rows(1), target)
    assert err.value.errno == errno.EROFS
    assert "cannot write" in str(err.value) and "generations" in str(err.value)


def test_crash_inside_a_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(StorageError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []
