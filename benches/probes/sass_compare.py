"""Compare the SASS of one CUDA source file built from two trees, kernel by kernel (no GPU).

Why: ptxas may turn the same kernel, reached through different source, into different SASS, and
such a difference can cost time (benches/NOTES.md "set-bit loops": 0.55 us a launch from a
kernel whose PTX matched up to register names). Before timing a change on the device, this says
which of a file's kernels it really changed.

    python -m benches.probes.sass_compare cuda/kernels/topk_f32_cluster.cu /tmp/base/cuda \
        [--nvdisasm PATH] [--filter TEXT] [-- extra nvcc flags]

builds the file from this tree's cuda/ and from the other tree's (the same relative path under
it; e.g. `git worktree add /tmp/base <commit>`, then pass /tmp/base/cuda) for sm_90a,
disassembles both and prints, for each kernel, its instruction count in each and whether they
are the same once branch labels are renumbered and the unnamed namespace's hash is set aside.
nvdisasm is not in the CUDA 13.0 toolkit here; `pip download nvidia-cuda-nvdisasm` and unzip
the wheel (its nvidia/cu13/bin/nvdisasm), or pass a toolkit's.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

FLAGS = [
    "-O3",
    "-DNDEBUG",
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-gencode=arch=compute_90a,code=sm_90a",
]


# The unnamed namespace's part of a mangled name: _GLOBAL__N__<hash>_<length>_<file>_cu_<hash>.
UNNAMED = re.compile(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+")


def cccl_include() -> str:
    """The toolkit's CCCL headers (CUB), beside the nvcc on the PATH."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        sys.exit("sass_compare: no nvcc on the PATH")
    root = pathlib.Path(nvcc).resolve().parent.parent
    found = sorted(root.glob("targets/*/include/cccl")) or sorted(root.glob("include/cccl"))
    return str(found[0]) if found else str(root / "include")


def renumbered(lines: list[str]) -> list[str]:
    """Branch labels renamed by first appearance, so that two kernels compare by their shape."""
    names: dict[str, str] = {}
    return [
        re.sub(r"\.L_x_\d+", lambda m: names.setdefault(m.group(0), f"L{len(names)}"), line)
        for line in lines
    ]


def kernels(
    cuda_root: pathlib.Path, source: str, nvdisasm: str, extra: list[str], cubin: pathlib.Path
) -> dict[str, list[str]]:
    """Each kernel's instructions, its labels renumbered and the unnamed namespace dropped."""
    subprocess.run(
        [
            "nvcc",
            f"-I{cuda_root}",
            f"-I{cccl_include()}",
            *FLAGS,
            *extra,
            "-x",
            "cu",
            "-cubin",
            str(cuda_root / source),
            "-o",
            str(cubin),
        ],
        check=True,
    )
    text = subprocess.run(
        [nvdisasm, "-c", str(cubin)], check=True, capture_output=True, text=True
    ).stdout
    found = {}
    parts = re.split(r"\n\s*\.text\.(\S+):", text)
    for name, body in zip(parts[1::2], parts[2::2]):
        lines = []
        for line in body.splitlines():
            line = re.sub(r"/\*[0-9a-f]+\*/", "", line).split(";")[0].strip()
            # Directives, comments, and labels (the next kernel's own name comes last).
            if not line or line.startswith((".", "//")) or line.endswith(":"):
                continue
            line = re.sub(r"__internal_\d+_", "__internal_", line)
            lines.append(UNNAMED.sub("", line))
        found[UNNAMED.sub("", name)] = renumbered(lines)
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m benches.probes.sass_compare")
    parser.add_argument("source", help="the .cu file, relative to the repository root")
    parser.add_argument("other_cuda", help="the other tree's cuda/ folder")
    parser.add_argument("--nvdisasm", default=shutil.which("nvdisasm") or "nvdisasm")
    parser.add_argument("--filter", default="", help="only kernels whose name holds this text")
    args = parser.parse_args(argv)
    source = pathlib.Path(args.source)
    if source.parts[0] != "cuda":
        parser.error(f"source: {args.source} is not under cuda/")
    relative = pathlib.Path(*source.parts[1:])
    with tempfile.TemporaryDirectory() as work:
        ours = kernels(
            pathlib.Path("cuda").resolve(),
            str(relative),
            args.nvdisasm,
            extra,
            pathlib.Path(work) / "ours.cubin",
        )
        theirs = kernels(
            pathlib.Path(args.other_cuda).resolve(),
            str(relative),
            args.nvdisasm,
            extra,
            pathlib.Path(work) / "theirs.cubin",
        )
    print(f"{'kernel':<70} {'this tree':>10} {'other':>10}  same SASS")
    for name in sorted(set(ours) | set(theirs)):
        if args.filter not in name:
            continue
        a, b = ours.get(name), theirs.get(name)
        same = "yes" if a == b else "no"
        short = re.search(r"\d+([A-Z]\w*Kernel\w*)", name)  # the mangled name's kernel part
        label = short.group(1) if short else name[-70:]
        print(f"{label[:70]:<70} {len(a) if a else '-':>10} {len(b) if b else '-':>10}  {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
