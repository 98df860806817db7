"""benches/report.py: the CUB peer section finds our record of each CUB shape and is written
into the Markdown report when the probe's records lie beside the results file."""

from __future__ import annotations

import json

from benches import report


def _ours(op, dtype, rows, n, k, lengths, us):
    return {
        "op": op,
        "dtype": dtype,
        "rows": rows,
        "n": n,
        "k": k,
        "lengths": lengths,
        "ours_us": us,
    }


def _cub(dtype, rows, n, k, lengths, us, peer="DeviceTopK per row"):
    return {
        "peer": f"cub::{peer}",
        "dtype": dtype,
        "rows": rows,
        "n": n,
        "k": k,
        "lengths": lengths,
        "median_us": us,
        "min_us": us,
        "keys_checked": True,
    }


def test_cub_section_pairs_shapes_and_ratios():
    records = [
        _ours("topk_filtered", "float32", 1, 32768, 2048, "full", 10.0),
        _ours("top_k", "float32", 1, 32768, 2048, "full", 99.0),  # not a latency-table op
        _ours("topk_bf16", "bfloat16", 128, 16384, 512, "full", 4.0),
    ]
    cub = [
        _cub("float32", 1, 32768, 2048, "full", 12.5),
        _cub("bfloat16", 128, 16384, 512, "full", 11.0),
        _cub("bfloat16", 128, 8192, 512, "full", 7.0, peer="DeviceBatchedTopK"),
    ]
    lines = report.cub_section(records, cub).splitlines()
    rows = [line for line in lines if line.startswith("| float32") or line.startswith("| bfloat16")]
    assert rows[0].split(" | ")[5:9] == ["10.0", "12.5", "cub::DeviceTopK per row", "1.25"]
    assert rows[1].split(" | ")[5:9] == ["4.0", "11.0", "cub::DeviceTopK per row", "2.75"]
    assert rows[2].split(" | ")[5:9] == ["-", "7.0", "cub::DeviceBatchedTopK", "-"]


def test_report_includes_the_cub_section_only_beside_its_records(tmp_path):
    record = _ours("topk_filtered", "float32", 4, 32768, 2048, "full", 12.0)
    record.update(
        ours_wall_us=20.0,
        lax_top_k_us=600.0,
        torch_topk_us=None,
        floor_us=0.1,
        device="test",
        jax="0",
        date="2026-12-02",
        same_set_as_peers=True,
    )
    path = str(tmp_path / "r.json")
    report.save([record], path)
    report.write_report([record], path)
    assert "CUB's top-k" not in (tmp_path / "r.md").read_text()
    with open(report.cub_path(path), "w") as f:
        json.dump([_cub("float32", 4, 32768, 2048, "full", 12.4)], f)
    report.write_report([record], path)
    assert "| float32 | 4 | 32768 | 2048 | full | 12.0 | 12.4 |" in (tmp_path / "r.md").read_text()
