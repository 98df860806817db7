"""The differential fuzzer (tests/checks/fuzz.py) on whatever backend is here: its cases agree
(on a CPU-only machine the CPU handler against the NumPy contract), a case is a function of
(seed, index), and a corrupted result is reported and written out."""

from __future__ import annotations

import json

import jax
import numpy as np

import jax_topk
from tests.checks import fuzz


def test_fuzz_cases_agree():
    lines = []
    total, failures = fuzz.fuzz(float("inf"), 60, 20261206, None, log=lines.append)
    assert total == 60, lines
    assert not failures, "\n".join(lines)
    assert {fuzz.make_case(20261206, i).op for i in range(60)} == set(fuzz.OP_WEIGHTS)


def test_a_case_is_a_function_of_seed_and_index():
    """The same case and the same inputs, results and references on a second run, for a case
    of each operator."""
    assert fuzz.make_case(5, 17) == fuzz.make_case(5, 17)
    assert fuzz.make_case(5, 17) != fuzz.make_case(5, 18)
    first_of_op = {}
    for index in range(60):
        first_of_op.setdefault(fuzz.make_case(5, index, 200_000).op, index)
    assert set(first_of_op) == set(fuzz.OP_WEIGHTS)
    for index in first_of_op.values():
        case = fuzz.make_case(5, index, 200_000)
        first = fuzz.run_case(case, 5, "cpu")
        again = fuzz.run_case(case, 5, "cpu")
        for a, b in zip(first[0] + first[1], again[0] + again[1]):
            np.testing.assert_array_equal(a, b)
        assert first[2].keys() == again[2].keys()
        for name, array in first[2].items():
            np.testing.assert_array_equal(array, again[2][name], err_msg=f"{case.label()} {name}")


def test_a_difference_is_reported_and_written(monkeypatch, tmp_path):
    real = fuzz.run_case

    def corrupted(case, seed, backend):
        actual, expected, arrays = real(case, seed, backend)
        wrong = np.array(actual[-1])  # the indices (top_k and merge_topk: the second result)
        wrong.reshape(-1)[-1] ^= 1  # one bit of the last index
        return (*actual[:-1], wrong), expected, arrays

    monkeypatch.setattr(fuzz, "run_case", corrupted)
    lines = []
    total, failures = fuzz.fuzz(float("inf"), 3, 7, tmp_path, log=lines.append)
    assert total == 3 and len(failures) == 3
    assert sum(line.startswith("MISMATCH") for line in lines) == 3
    records = [json.loads(line) for line in (tmp_path / "failures.jsonl").read_text().splitlines()]
    assert [r["index"] for r in records] == [0, 1, 2]
    assert all("entries differ" in r["problem"] for r in records)
    assert (tmp_path / "case-7-0.npz").exists()
    assert all(r["seed"] == 7 and r["max_elements"] == fuzz.MAX_ELEMENTS for r in records)


def test_a_run_without_cases_fails():
    assert fuzz.main(["--cases", "0", "--seed", "3"]) == 1
    assert fuzz.main(["--seconds", "0", "--seed", "3"]) == 1


def test_first_and_cases_pick_a_range(monkeypatch, capsys):
    """`--first I --cases N` runs cases I to I + N - 1 (.ci/gpu's memcheck chunks), and
    `--announce` names each before it runs."""
    seen = []
    real = fuzz.run_case

    def recording(case, seed, backend):
        seen.append(case.index)
        return real(case, seed, backend)

    monkeypatch.setattr(fuzz, "run_case", recording)
    arguments = ["--seed", "11", "--first", "5", "--cases", "3", "--max-elements", "100000"]
    assert fuzz.main([*arguments, "--announce"]) == 0
    assert seen == [5, 6, 7]
    lines = capsys.readouterr().out.splitlines()
    announced = [line for line in lines if line.startswith("running")]
    assert announced == [f"running {fuzz.make_case(11, i, 100000).label()}" for i in (5, 6, 7)]


def test_skip_xla_sort_leaves_out_only_the_sort_path(monkeypatch, capsys):
    """`--skip-xla-sort` (.ci/gpu's memcheck chunks) leaves out exactly the top_k cases that
    top_k's route sends to XLA's sort, such as the case the sanitizer crashed in, and says so."""
    crashed = fuzz.make_case(24776, 9, 100000)  # top_k float16 7 x 13736, k = n
    assert crashed.op == "top_k" and fuzz.runs_only_xla_sort(crashed)
    assert not fuzz.runs_only_xla_sort(fuzz.make_case(24776, 8, 100000))  # top_k, k = 2048
    seen = []

    def recorded(case, seed, backend):  # no outputs, no arrays: a case that agrees
        seen.append(case.index)
        return (), (), {}

    monkeypatch.setattr(fuzz, "run_case", recorded)
    arguments = ["--seed", "24776", "--first", "0", "--cases", "40", "--max-elements", "100000"]
    assert fuzz.main([*arguments, "--announce", "--skip-xla-sort"]) == 0
    sort_path = [i for i in range(40) if fuzz.runs_only_xla_sort(fuzz.make_case(24776, i, 100000))]
    assert 9 in sort_path and seen == [i for i in range(40) if i not in sort_path]
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("skipping") for line in lines) == len(sort_path)
    assert f"({len(sort_path)} of XLA's sort path left out)" in lines[-1]


def test_the_sort_path_test_agrees_with_top_k(monkeypatch):
    """runs_only_xla_sort says what top_k itself does: traced as the fuzzer calls it (two axes
    and lengths included), a case reaches the sort (_fallback.select_with_values) exactly when
    runs_only_xla_sort says so."""
    from jax_topk import _top_k

    reached = []
    real = _top_k._fallback.select_with_values

    def recording(*args, **kwargs):
        reached.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(_top_k._fallback, "select_with_values", recording)
    cases = [fuzz.make_case(s, i, 100000) for s in (24776, 6123) for i in range(120)]
    cases = [c for c in cases if c.op == "top_k"]
    assert any(fuzz.runs_only_xla_sort(c) for c in cases)
    for case in cases:
        shape = (2, case.rows // 2, case.n) if case.two_axes else (case.rows, case.n)
        scores = jax.ShapeDtypeStruct(shape, fuzz.DTYPES[case.dtype])
        lengths = None
        if case.lengths_kind != "none":
            lengths = jax.ShapeDtypeStruct(shape[:-1], np.int32)
        reached.clear()
        jax.eval_shape(
            lambda x, n, k=case.k, s=case.sorted: jax_topk.top_k(x, k, lengths=n, sorted=s),
            scores,
            lengths,
        )
        assert bool(reached) == fuzz.runs_only_xla_sort(case), case.label()
