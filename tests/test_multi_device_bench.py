"""The multi-device benchmark (`python -m benches.multi_device --quick`) on 8 host devices, in
its own process (the device count is fixed at JAX's start): every configuration equals the
one-device run and passes the HLO check, and the results file and table are written."""

import json

from tests.support.processes import run_python


def test_quick_run_on_8_host_devices_is_exact_and_moves_only_candidates(tmp_path):
    results = tmp_path / "cpu8.json"
    stdout = run_python(
        *("-m", "benches.multi_device", "--quick", "--json", str(results)),
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
    )
    assert "HLO check control: an all-gather of the scores fails it" in stdout
    records = json.loads(results.read_text())
    # For each op: one device; rows, columns x 2 merges on 2, 4 and 8; 2 x 2 and 2 x 4 x 2.
    configurations = {(r["mesh"], r["column_merge"]) for r in records}
    expected = {("1x1", None), ("2x1", None), ("4x1", None), ("8x1", None)}
    expected |= {
        (mesh, merge)
        for mesh in ("1x2", "1x4", "1x8", "2x2", "2x4")
        for merge in ("all_gather", "tree")
    }
    assert configurations == expected
    assert len(records) == 2 * len(expected)
    assert {r["op"] for r in records} == {"topk_filtered", "top_k"}
    for r in records:
        label = f"{r['op']} {r['mesh']} {r['column_merge']}"
        assert r["equal_to_one_device"], label
        assert r["hlo_passed"], f"{label}: {r['hlo']}"
        carrier = {None: "no collective", "all_gather": "all-gather", "tree": "collective-permute"}
        assert carrier[r["column_merge"]] in r["hlo"], f"{label}: {r['hlo']}"
        assert (r["gather_wall_us"] is None) == (r["column_merge"] is None), label
    table = results.with_suffix(".md").read_text()
    assert sum(line.startswith("| top") for line in table.splitlines()) == len(records)
    assert f"{len(records)} of {len(records)} configurations equal to one device" in stdout
