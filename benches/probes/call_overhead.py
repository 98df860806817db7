"""Where a call's wall time goes: the bench's 'ours wall' (the latency a JAX user sees) reads
27-51 us at the decode shapes whose kernels take 3.5-10 us (benches/results/h200.md), and
shared/BENCH.md measured a trivial FFI custom call at 7-8 us. This probe splits that time, per
call of one jitted function holding R calls (bench.wall_time_us, R = 1 and 8):
- wall: median wall time / R; device: the summed kernel time of one call (bench's profiler
  method; '-' on a machine without a GPU); host = wall - device, what the GPU waited for.
- rows: an XLA fusion on the same rows (XLA's own cost of an op; at R = 8 XLA may fuse the
  eight into fewer kernels), jax.lax.top_k, and ours at issue 16's decode shapes plus a tiny
  topk_filtered and top_k call (a 1 x 64 row: our handler's fixed cost with a kernel of ~2 us).
  Device time is one call's (R = 1), subtracted from both walls. Then the fusion and
  topk_filtered on 2048 x 131072 float32 rows (1 GB a set; 4 rows without a GPU): h200.json's
  wall exceeds its device time by 150-280 us at the causal shapes, 75 at topk_bf16 2048 x 16384,
  so whether the gap grows with the data for XLA's own kernels too, or is ours.
- modes: as configured, then in child processes with XLA's command buffers off
  (XLA_FLAGS=--xla_gpu_enable_command_buffer=) and with custom calls kept out of them
  (=-CUSTOM_CALL): if our host part drops there, the cost is the command buffer's (a capture or
  an update a call), not the handler's.
Run from the repo root: python -m benches.probes.call_overhead [--repeats 30]"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_topk
from benches.bench import median_call_us, traced_kernel_events, wall_time_us

# The child processes' modes: the XLA flag each adds.
CHILD_MODES = {
    "command buffers off": "--xla_gpu_enable_command_buffer=",
    "custom calls out of command buffers": "--xla_gpu_enable_command_buffer=-CUSTOM_CALL",
}


def _calls(rng):
    """(name, fn, input sets): each fn one op on distinct (rows, lengths) of one shape, the
    lengths whole (topk_bf16 and topk_filtered take them; the other calls ignore them)."""

    def sets(shape, dtype, count=8):
        whole = jnp.full(shape[:-1], shape[-1], jnp.int32)
        scores = [rng.standard_normal(shape, np.float32) for _ in range(count)]
        return [(jnp.asarray(s).astype(dtype), whole) for s in scores]

    bf16_row, f32_row = sets((1, 16384), jnp.bfloat16), sets((1, 32768), jnp.float32)
    vocabulary, tiny = sets((1, 152064), jnp.bfloat16), sets((1, 64), jnp.float32)
    rows = 2048 if jax.default_backend() == "gpu" else 4
    large = [  # drawn on the device: 8 GB from the host would take a while
        (jax.random.normal(key, (rows, 131072), jnp.float32), jnp.full((rows,), 131072, jnp.int32))
        for key in jax.random.split(jax.random.key(1), 8)
    ]
    return [
        ("XLA fusion x * 2 + 1, bf16 1x16384", lambda x, n: x * 2 + 1, bf16_row),
        ("jax.lax.top_k bf16 1x16384 k=512", lambda x, n: jax.lax.top_k(x, 512), bf16_row),
        ("topk_bf16 1x16384 k=512", lambda x, n: jax_topk.topk_bf16(x, n, k=512), bf16_row),
        ("topk_filtered f32 1x32768 k=2048", jax_topk.topk_filtered, f32_row),
        ("top_k bf16 1x152064 k=50", lambda x, n: jax_topk.top_k(x, 50), vocabulary),
        ("topk_filtered f32 1x64 k=8 (tiny)", lambda x, n: jax_topk.topk_filtered(x, n, k=8), tiny),
        ("top_k f32 1x64 k=8 (tiny)", lambda x, n: jax_topk.top_k(x, 8), tiny),
        (f"XLA fusion x * 2 + 1, f32 {rows}x131072", lambda x, n: x * 2 + 1, large),
        (f"topk_filtered f32 {rows}x131072 k=2048", jax_topk.topk_filtered, large),
    ]


def _device_us(fn, input_sets) -> str:
    if jax.default_backend() != "gpu":
        return "-"
    calls = 24
    events = traced_kernel_events(fn, input_sets, calls)
    events = sorted(e for device in events.values() for e in device)
    return f"{median_call_us(events, calls):.1f} ({len(events) // calls})"


def table(repeats: int, mode: str) -> list[str]:
    rows = []
    for name, fn, input_sets in _calls(np.random.default_rng(0)):
        jitted = jax.jit(fn)
        device = _device_us(jitted, input_sets)
        walls = [wall_time_us(fn, input_sets[:r], repeats) for r in (1, 8)]
        if device == "-":
            hosts = "-"
        else:
            hosts = " / ".join(f"{w - float(device.split()[0]):.1f}" for w in walls)
        cells = [mode, name, device, f"{walls[0]:.1f} / {walls[1]:.1f}", hosts]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--child-mode", choices=list(CHILD_MODES), help="(a child process)")
    args = parser.parse_args(argv)
    # The parent and the children share the GPU: none takes most of its memory up front.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    flags = os.environ.get("XLA_FLAGS", "")
    rows = table(args.repeats, args.child_mode or "as configured")
    if args.child_mode:
        print("\n".join(rows), flush=True)
        return 0
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, XLA_FLAGS={flags!r}")
    print("| mode | call | device us (kernels) | wall us, R = 1 / 8 | wall - device, R = 1 / 8 |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows), flush=True)
    failed = 0
    for mode, flag in CHILD_MODES.items():
        child = dict(os.environ, XLA_FLAGS=f"{flags} {flag}".strip())
        command = [sys.executable, "-m", "benches.probes.call_overhead", "--child-mode", mode]
        command += ["--repeats", str(args.repeats)]
        done = subprocess.run(command, env=child, capture_output=True, text=True)
        print(done.stdout, end="", flush=True)
        if done.returncode:
            print(f"{mode}: rc {done.returncode}\n{done.stderr[-2000:]}", file=sys.stderr)
            failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main())
