"""The benchmark (`python -m benches.bench`, from the repository root): not part of the
installed package."""
