"""The matrix-multiply burn of one device, run by the vLLM venv's interpreter (so with its
torch; numpy on a CPU where torch is absent): `python gpu_burn.py --device cuda:0 --seconds
60 --memory-fraction 0.75 --size 32768`. It imports nothing of pytest-haico (the venv has
none) and prints one JSON line: the device, the matmuls done, their seconds and TFLOP/s, and
the share of the device's memory held while they ran; or the error that stopped it, in one
line (torch's own messages end in advice lines that would hide it)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from typing import Any


def _burn_torch(args: argparse.Namespace) -> dict[str, Any]:
    torch: Any = importlib.import_module("torch")  # the venv's; no stubs here

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # the floor is for the dtype asked
    a = torch.randn(args.size, args.size, device=device, dtype=dtype)
    b = torch.randn(args.size, args.size, device=device, dtype=dtype)
    c = torch.empty(args.size, args.size, device=device, dtype=dtype)
    held = None
    filler = None
    if cuda:
        free, total = torch.cuda.mem_get_info(device)
        # Occupy the rest of the fraction asked, beyond what is in use already.
        wanted = int(args.memory_fraction * total) - (total - free)
        if wanted > 0:
            filler = torch.empty(wanted, dtype=torch.uint8, device=device)
        held = 1 - torch.cuda.mem_get_info(device)[0] / total

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    torch.matmul(a, b, out=c)  # the first one pays for kernel selection
    sync()
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        for _ in range(10):
            torch.matmul(a, b, out=c)
        sync()
        count += 10
    elapsed = time.perf_counter() - started
    del filler
    return {"backend": "torch", "iterations": count, "seconds": elapsed, "memory_held": held}


def _burn_numpy(args: argparse.Namespace) -> dict[str, Any]:
    import numpy

    if args.device != "cpu":
        raise RuntimeError(f"torch is not importable, and numpy cannot use {args.device}")
    rng = numpy.random.default_rng(0)
    a = rng.standard_normal((args.size, args.size)).astype(args.dtype)
    b = rng.standard_normal((args.size, args.size)).astype(args.dtype)
    c = numpy.empty_like(a)
    numpy.matmul(a, b, out=c)
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        numpy.matmul(a, b, out=c)
        count += 1
    elapsed = time.perf_counter() - started
    return {"backend": "numpy", "iterations": count, "seconds": elapsed, "memory_held": None}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu_burn")
    parser.add_argument("--device", required=True, help="cuda:0, cuda:1, ... or cpu")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--memory-fraction", type=float, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    has_torch = importlib.util.find_spec("torch") is not None
    try:
        result = _burn_torch(args) if has_torch else _burn_numpy(args)
    except Exception as exc:  # a device that is not there, out of memory: one line for the check
        said = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {said[0] if said else 'no message'}"
        print(json.dumps({"device": args.device, "error": error}), flush=True)
        return 1
    flops = 2 * args.size**3 * result["iterations"]
    result.update(
        device=args.device,
        size=args.size,
        dtype=args.dtype,
        tflops=flops / result["seconds"] / 1e12 if result["seconds"] > 0 else 0.0,
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
