"""Merge building blocks: prompt normalisation, digests, first-occurrence dedup, mix and eval sizes."""

import numpy as np
import pyarrow as pa
import pytest

from tasks.config import MergeSourceConfig
from tasks.merge.dedup import first_occurrences
from tasks.merge.hashing import hash_strings, hash_token_lists, list_sums, normalise_prompts
from tasks.merge.mix import plan_eval, plan_sizes
from tasks.merge.shuffle import BucketStore


def test_prompt_normalisation():
    raw = pa.array(["  Héllo\u00a0\tWORLD\n", "ＡＢＣ  x", None, "a b"])
    assert normalise_prompts(raw).to_pylist() == ["héllo world", "abc x", None, "a b"]


def test_token_list_digests_follow_content_not_layout():
    lists = pa.array([[1, 2, 3], [1, 2], [1, 2, 3], [], [3, 2, 1]], type=pa.list_(pa.int32()))
    digests = hash_token_lists(lists)
    assert digests[0] == digests[2] and len(set(digests.tolist())) == 4
    assert hash_token_lists(lists.slice(2)).tolist() == digests[2:].tolist()
    assert list_sums(pa.array([[0, 1, 1], [], [0, 0]], type=pa.list_(pa.int8()))).tolist() == [2, 0, 0]


def test_string_digests_depend_on_key():
    ids = pa.array(["a", "b", "a"])
    plain, keyed = hash_strings(ids), hash_strings(ids, key=b"seed")
    assert plain[0] == plain[2] != plain[1] and keyed[0] != plain[0]
    assert hash_strings(ids.slice(1)).tolist() == plain[1:].tolist()


def test_first_occurrence_wins_in_scan_order():
    keys = np.array([5, 7, 5, 9, 7, 5], dtype=np.uint64)
    dropped, kept = first_occurrences(keys, np.array([1, 2, 3, 4, 5]))
    assert dropped.tolist() == [4, 5] and kept.tolist() == [1, 2]


def sources(*specs):
    return [MergeSourceConfig(name=f"s{i}", **spec) for i, spec in enumerate(specs)]


def test_weights_shrink_to_the_scarcest_source_and_caps_hold():
    assert plan_sizes(sources({"weight": 3}, {"weight": 1}), [60, 50]) == [60, 20]
    assert plan_sizes(sources({"weight": 1}, {"weight": 1}), [60, 50]) == [50, 50]
    assert plan_sizes(sources({"weight": 1, "max_rows": 10}, {"weight": 2}), [60, 50]) == [10, 20]
    assert plan_sizes(sources({}, {"max_rows": 5}), [7, 50]) == [7, 5]


@pytest.mark.parametrize(
    "sizes, eval_size, expected",
    [([40, 20], 0.25, [10, 5]), ([40, 20], 7, [5, 2]), ([3, 3, 3], 2, [1, 1, 0]), ([4, 1], 100, [4, 1]), ([5], 0.0, [0])],
)
def test_eval_rows_per_source(sizes, eval_size, expected):
    assert plan_eval(sizes, eval_size) == expected


def test_buckets_partition_priorities_in_order(tmp_path):
    store = BucketStore(tmp_path, 4)
    priorities = np.array([0, 2**62, 2**63, 2**64 - 1, 3 * 2**62 - 1], dtype=np.uint64)
    assert store.bucket_of(priorities).tolist() == [0, 1, 2, 3, 2]
