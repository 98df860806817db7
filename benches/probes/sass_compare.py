"""Compare the SASS of one CUDA source file built from two trees, kernel by kernel (no GPU).

Why: ptxas may turn the same kernel, reached through different source, into different SASS, and
such a difference can cost time (benches/NOTES.md "set-bit loops": 0.55 us a launch from a
kernel whose PTX matched up to register names). Before timing a change on the device, this says
which of a file's kernels it really changed.

    python -m benches.probes.sass_compare cuda/kernels/topk_f32_cluster.cu /tmp/base/cuda \
        [--nvdisasm PATH] [--filter TEXT] [-- extra nvcc flags]

builds the file from this tree's cuda/ and from the other tree's (the same relative path under
it) for sm_90a, disassembles both and prints, for each kernel, its instruction count in each and
whether they are the same once labels and the unnamed namespace's hash are set aside. nvdisasm
is not in the CUDA 13.0 toolkit here; `pip download nvidia-cuda-nvdisasm` and unzip the wheel
(its nvidia/cu13/bin/nvdisasm), or pass a toolkit's.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

CCCL = "/usr/local/cuda-13.0/targets/x86_64-linux/include/cccl"
FLAGS = ["-O3", "-DNDEBUG", "-std=c++17", "--expt-relaxed-constexpr",
         "-gencode=arch=compute_90a,code=sm_90a"]


def kernels(cuda_root: pathlib.Path, source: str, nvdisasm: str, extra: list[str],
            work: pathlib.Path) -> dict[str, list[str]]:
    """Each kernel's instructions (labels and the unnamed namespace's hash normalised)."""
    cubin = work / f"{abs(hash(str(cuda_root)))}.cubin"
    subprocess.run(["nvcc", f"-I{cuda_root}", f"-I{CCCL}", *FLAGS, *extra, "-x", "cu", "-cubin",
                    str(cuda_root / source), "-o", str(cubin)], check=True)
    text = subprocess.run([nvdisasm, "-c", str(cubin)], check=True, capture_output=True,
                          text=True).stdout
    found = {}
    parts = re.split(r"\n\s*\.text\.(\S+):", text)
    for name, body in zip(parts[1::2], parts[2::2]):
        lines = []
        for line in body.splitlines():
            line = re.sub(r"/\*[0-9a-f]+\*/", "", line).split(";")[0].strip()
            if not line or line.startswith((".", "//")):
                continue
            line = re.sub(r"\.L_x_\d+", "L", line)
            line = re.sub(r"__internal_\d+_", "__internal_", line)
            lines.append(re.sub(r"_GLOBAL__N__[0-9a-f_]+", "", line))
        found[re.sub(r"_GLOBAL__N__[0-9a-f_]+", "", name)] = lines
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
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
        ours = kernels(pathlib.Path("cuda").resolve(), str(relative), args.nvdisasm, extra,
                       pathlib.Path(work))
        theirs = kernels(pathlib.Path(args.other_cuda).resolve(), str(relative), args.nvdisasm,
                         extra, pathlib.Path(work))
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
