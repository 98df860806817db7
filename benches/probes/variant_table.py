"""The table two variant probes end on (f32_cluster_stamps.sh ROUNDS=n, bf16_rows_variants.sh):
each shape's us a launch by variant, the median and range over a variant's runs, from the probe
binaries' printed lines (a shape name padded to `--name-width` columns, then the time; a line
that says WRONG marks its variant). Lines that are not such a row (headers, stamps, notes) are
skipped.
    python -m benches.probes.variant_table --name-width 22 NAME=FILE[,FILE...] ...
Prints a markdown table."""

import argparse
import statistics


def read_runs(paths: list[str], name_width: int) -> tuple[dict[str, list[float]], bool]:
    """{shape: [us of each run]} from the probe's outputs, and whether any row said WRONG."""
    runs, wrong = {}, False
    for path in paths:
        for line in open(path):
            fields = line[name_width:].split()
            if not fields or line.startswith(" "):
                continue
            try:
                us = float(fields[0])
            except ValueError:  # a header or a note, not a shape's row
                continue
            runs.setdefault(line[:name_width].strip(), []).append(us)
            wrong |= "WRONG" in line
    return runs, wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name-width", type=int, required=True)
    parser.add_argument("variants", nargs="+", metavar="NAME=FILE[,FILE...]")
    args = parser.parse_args()
    names, by_variant, wrong = [], {}, []
    for spec in args.variants:
        name, _, files = spec.partition("=")
        names.append(name)
        by_variant[name], any_wrong = read_runs(files.split(","), args.name_width)
        if any_wrong:
            wrong.append(name)
    shapes = list(dict.fromkeys(s for name in names for s in by_variant[name]))
    print("us a launch in a graph: median (min-max) over each variant's runs")
    print("| shape | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for shape in shapes:
        cells = []
        for name in names:
            runs = by_variant[name].get(shape)
            cells.append(
                f"{statistics.median(runs):.2f} ({min(runs):.2f}-{max(runs):.2f})" if runs else "-"
            )
        print(f"| {shape} | " + " | ".join(cells) + " |")
    print("variants with a WRONG row:", ", ".join(wrong) or "none")


if __name__ == "__main__":
    main()
