"""The tests, a package so that `tests.support` and `tests.checks` import by one name from the
tests, the check scripts (`python -m tests.checks.<name>`) and benches/bench.py."""
