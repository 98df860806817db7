"""benches/targets.py: every target of issues 13-16 reads a row of the committed results, and
its verdict turns at the limit, both ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benches import targets

RESULTS = Path(__file__).resolve().parent.parent / "benches" / "results" / "h200.json"


def committed_records():
    return json.loads(RESULTS.read_text())


def test_every_target_reads_the_committed_results():
    records = committed_records()
    without_row = [t.what for t in targets.TARGETS if t.verdict(records)[1] == "no row"]
    assert without_row == []
    table = targets.describe(records)
    assert table.count("\n| 1") == len(targets.TARGETS)  # a row a target (issues 13-16)
    met = sum(t.verdict(records)[1] == "met" for t in targets.TARGETS)
    assert f"{met} of {len(targets.TARGETS)} targets met" in table


def record(op="topk_filtered", dtype="float32", rows=1, n=32768, k=2048, **fields):
    return {"op": op, "dtype": dtype, "rows": rows, "n": n, "k": k, "lengths": "full", **fields}


@pytest.mark.parametrize("ours, status", [(5.99, "met"), (6.0, "met"), (6.01, "missed")])
def test_a_time_target_turns_at_its_limit(ours, status):
    target = targets.Target(
        16, "f32 1 x 32768", targets.time_of("topk_filtered", "float32", 1, 32768), 6, "us"
    )
    value, got, gap = target.verdict([record(ours_us=ours)])
    assert (value, got) == (ours, status) and gap == pytest.approx(ours / 6)


@pytest.mark.parametrize("lax, status", [(50.0, "met"), (49.9, "missed")])
def test_an_at_least_target_turns_at_its_limit(lax, status):
    measure = targets.speedup_over_lax("top_k", "float32", 1, 152064)
    target = targets.Target(13, "speed-up", measure, 5, "x lax", at_least=True)
    rows = [record("top_k", rows=1, n=152064, k=50, ours_us=10.0, lax_top_k_us=lax)]
    assert target.verdict(rows)[1] == status
    assert target.verdict([])[1] == "no row"


def test_two_rows_of_one_shape_are_refused():
    rows = [record(ours_us=1.0), record(ours_us=2.0)]
    with pytest.raises(ValueError, match="2 records match"):
        targets.find(rows, "topk_filtered", "float32", 1, 32768)


def test_each_merge_target_reads_its_own_list_order():
    """Issue 14's two targets read the bench's rows of lists in no order ("full") and in rank
    order ("sorted"), which share every other field of the shape."""
    merge = [t for t in targets.TARGETS if t.issue == 14]
    rows = [
        record("merge_topk", rows=5536, n=16384, lengths=lengths, ours_us=us, floor_us=100.0)
        for lengths, us in (("full", 140.0), ("sorted", 160.0))
    ]
    verdicts = [t.verdict(rows)[:2] for t in merge]
    assert verdicts == [(pytest.approx(1.4), "met"), (pytest.approx(1.6), "missed")]
