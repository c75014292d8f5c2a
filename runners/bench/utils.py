"""What every benchmark shares: median timing, the device's copy bandwidth and exponential rate, forward and
forward+backward closures, and the error measure of its correctness gate."""

from __future__ import annotations

import math
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from mixlab.kernels._triton import HAS_TRITON, tl, triton

# The exponential-rate probe: elements (a few per thread of an H200, so the chains' latency hides) and exp2
# calls chained on each.
EXP2_ELEMENTS, EXP2_CHAIN = 1 << 21, 512


# fmt: off
@triton.jit
def _exp2_chain_kernel(x_ptr, N, CHAIN: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < N
    b_x = tl.load(x_ptr + o, mask=m, other=0.0)
    for _ in range(CHAIN):
        # each exp2 takes the last one's result, kept in [-0.5, -0.25): none can be folded or skipped
        b_x = tl.exp2(b_x) * -0.5
    tl.store(x_ptr + o, b_x, mask=m)
# fmt: on


def exp2_chain(x: torch.Tensor, chain: int) -> torch.Tensor:
    """x (fp32, 1-d, in place) after ``chain`` steps of x = -exp2(x) / 2 in Triton: the probe's kernel."""
    block = 1024
    _exp2_chain_kernel[(triton.cdiv(x.numel(), block),)](x, x.numel(), CHAIN=chain, BLOCK=block)
    return x


def exp2_rate(device: torch.device, repeats: int = 100) -> float | None:
    """Measured fp32 exp2 calls per second of the device's special-function units (the bound of attention's
    softmax at tiny head sizes); None off CUDA or without Triton."""
    if device.type != "cuda" or not HAS_TRITON:
        return None
    x = torch.full((EXP2_ELEMENTS,), -0.3, device=device)
    ms = median_time_ms(lambda: exp2_chain(x, EXP2_CHAIN), repeats, device)
    return EXP2_ELEMENTS * EXP2_CHAIN / (ms * 1e-3)


def median_time_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median time of fn in ms: do_bench on CUDA (``repeats`` is its rep, in ms), wall clock of 3 calls on a CPU."""
    if device.type == "cuda":
        import triton  # only a CUDA machine times with do_bench; Triton is optional elsewhere

        return triton.testing.do_bench(fn, warmup=25, rep=repeats, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def device_line(device: torch.device, extra: str = "", cpu_name: str = "CPU (Triton interpreter)") -> str:
    """The kernel benchmarks' header line: ``- device: NAME; torch V, Triton V, CUDA V`` and ``extra``."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name
    version = triton.__version__ if HAS_TRITON else "not installed"
    return f"- device: {name}; torch {torch.__version__}, Triton {version}, CUDA {torch.version.cuda}{extra}"


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative RMS error in float64; inf when ``actual`` is not finite."""
    actual, expected = actual.double(), expected.double()
    if not torch.isfinite(actual).all():
        return math.inf
    scale = expected.pow(2).mean().sqrt().item()
    err = (actual - expected).pow(2).mean().sqrt().item()
    if scale == 0.0:
        return 0.0 if err == 0.0 else math.inf
    return err / scale


def time_us(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    return 1e3 * median_time_ms(fn, repeats, device)


def copy_bandwidth(device: torch.device, repeats: int) -> float:
    """Bytes per second of a 1 GiB (256 MiB on a CPU) device copy, read plus write."""
    n = (1 << 28) if device.type == "cuda" else (1 << 26)
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / (time_us(lambda: dst.copy_(src), repeats, device) * 1e-6)


def fwd_bwd_call(
    fn: Callable, inputs: dict, upstream: torch.Tensor, **kwargs
) -> Callable[[], list[torch.Tensor]]:
    """A closure running fn forward and backward: -> [y, gradient of every input that is not None]."""
    leaves = {k: None if v is None else v.detach().clone().requires_grad_() for k, v in inputs.items()}
    grads_of = [v for v in leaves.values() if v is not None]

    def run():
        y = fn(**leaves, **kwargs)
        return [y, *torch.autograd.grad(y, grads_of, upstream)]

    return run


def backward_call(fn: Callable, inputs: dict, upstream: torch.Tensor, **kwargs) -> Callable[[], None]:
    """A closure running fn forward and ``.backward()`` as a model's training step calls an op: the inputs are leaf
    tensors whose gradients accumulate into ``.grad`` from the second call on (what ``fwd_bwd_call``'s
    ``autograd.grad`` never pays: autograd's accumulation, and any cast or copy it needs to match a leaf)."""
    leaves = {k: None if v is None else v.detach().clone().requires_grad_() for k, v in inputs.items()}

    def run():
        fn(**leaves, **kwargs).backward(upstream)

    return run


def fwd_call(fn: Callable, inputs: dict, **kwargs) -> Callable[[], torch.Tensor]:
    """A closure running fn forward only, without autograd: -> y."""
    def run():
        with torch.no_grad():
            return fn(**inputs, **kwargs)

    return run


def cuda_graph_replay(fn: Callable[[], object]) -> Callable[[], None]:
    """fn captured once as a CUDA graph (after three warm-up calls on a side stream, as capture requires) ->
    the graph's replay: the same kernels on the same buffers, launched by one host call."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def error_line(err: BaseException, width: int = 120) -> str:
    """One line for a failed implementation: ``Type: first line of its message``; an exception without a message
    (a bare ``assert`` in another project's kernel) is named by where it was raised, ``Type at file.py:line``."""
    lines = str(err).splitlines()
    if lines:
        return f"{type(err).__name__}: {lines[0][:width]}"
    frames = traceback.extract_tb(err.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{type(err).__name__}{where}"


def measure_graphed(fn_fwd, fn_total, repeats: int, device: torch.device) -> tuple[float | None, float | None, str]:
    """``measure_pair`` of each closure's CUDA graph replay: the same do_bench (L2 flushed before each call), the
    host's launch and autograd overhead gone, so an eager time well above it is the host's, not the kernels'.
    (None, None, "") off CUDA; a closure that cannot be captured gets no timings and a note."""
    if device.type != "cuda":
        return None, None, ""
    try:
        fn_fwd, fn_total = cuda_graph_replay(fn_fwd), cuda_graph_replay(fn_total)
    except Exception as err:  # noqa: BLE001 - an op that syncs with the host cannot be captured; say so
        return None, None, f"CUDA graph: {error_line(err)}"
    return measure_pair(fn_fwd, fn_total, repeats, device)


def measure_one(fn: Callable[[], object], repeats: int, device: torch.device) -> tuple[float | None, str]:
    """(µs, note) of one closure, as ``measure_pair`` times each of its two."""
    try:
        return time_us(fn, repeats, device), ""
    except Exception as err:  # noqa: BLE001 - one broken baseline must not hide the other rows
        return None, error_line(err)


def measure_pair(fn_fwd, fn_total, repeats: int, device: torch.device) -> tuple[float | None, float | None, str]:
    """(fwd µs, fwd+bwd µs, note); a failing implementation gets no timings and a note naming the error."""
    try:
        return time_us(fn_fwd, repeats, device), time_us(fn_total, repeats, device), ""
    except Exception as err:  # noqa: BLE001 - one broken baseline must not hide the other rows
        return None, None, error_line(err)
