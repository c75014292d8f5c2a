"""Can rounding of the kind fla's kernels do explain gated DeltaNet's decay-gradient gap under bf16 autocast?

    python scripts/emulate_gdn_rounding.py

On the H200 (reproductions/baselines/NOTES.md) the gradients of the decay parameters ``a_log`` and ``dt_bias``
from fla's kernels sat about 9e-2 (relative RMS) from the lab's plain-torch path under bf16 autocast, ten times
the torch path's own autocast shift, while every other tensor agreed. fla's chunked kernels keep their WY
factors, chunk states and writes in the inputs' dtype (bf16) between stages, and Hopper's tensor cores read fp32
dot operands as tf32 (truncated). This script runs the torch path's chunked gated delta rule
(``fla_ops._chunked_gated_delta_rule``) with each of those roundings emulated, forward and backward, on the CPU,
and prints how far each moves the decay gradients and the other parameters' from the unemulated path, at the
shapes of ``tests/kernels/test_gpu_fla.py``'s mixer check (4 rows of 256 tokens, one document each), in chunks of
64 tokens as fla's kernels and the torch path on CUDA take them:

- ``bf16 storage``: u, w, each chunk's entering state and its writes rounded to bf16 (their gradients too);
- ``tf32 truncated`` / ``tf32 rounded``: every matrix product's operands cut (rounded) to tf32's 10-bit
  mantissa, forward and backward.

Each with bf16 autocast on and off. A gap of the measured size from one of them would point at it; rounding
that moves the decay gradients by a few 1e-3 does not explain 9e-2.
"""

import argparse
import functools

import torch
from mixlab.analysis import leakage
from mixlab.models.config import ModelConfig
from mixlab.models.mixers import MIXERS, fla_ops

SHAPES = [(128, 16), (64, 4)]  # d_model, n_heads: tests/kernels/test_gpu_fla.py's MIXER_SHAPES
ROWS, SEQ_LEN = 4, 256


def _bf16(t: torch.Tensor) -> torch.Tensor:
    """Rounded to bf16 and back (autograd rounds the gradient the same way on its way back)."""
    return t.to(torch.bfloat16).to(t.dtype)


def _tf32(t: torch.Tensor, nearest: bool) -> torch.Tensor:
    """fp32 with its mantissa cut to tf32's 10 bits (toward zero, as tensor cores read it), or rounded."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000 if nearest else bits) & -8192).view(torch.float32)


class _TF32MatMul(torch.autograd.Function):
    """a @ b on tf32 operands, and its two backward products on tf32 operands too."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, nearest: bool) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        ctx.nearest = nearest
        return _tf32(a, nearest) @ _tf32(b, nearest)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        a, b = (_tf32(t, ctx.nearest) for t in ctx.saved_tensors)
        grad = _tf32(grad, ctx.nearest)
        return grad @ b.transpose(-1, -2), a.transpose(-1, -2) @ grad, None


EMULATIONS = {
    "bf16 storage": {"stored": _bf16},
    "tf32 truncated": {"mm": lambda a, b: _TF32MatMul.apply(a, b, False)},
    "tf32 rounded": {"mm": lambda a, b: _TF32MatMul.apply(a, b, True)},
}


def _grads(module: torch.nn.Module, x: torch.Tensor, upstream: torch.Tensor, autocast: bool) -> dict:
    module.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = module(x)
    y.backward(upstream)
    return {name: p.grad.clone() for name, p in module.named_parameters()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).float().norm() / b.float().norm()).item()


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    shipped = fla_ops._chunked_gated_delta_rule
    fla_ops.GDR_CHUNK["cpu"] = fla_ops.GDR_CHUNK["cuda"]  # fla's chunk size, not the CPU's
    print("| d_model, heads | emulation | autocast | a_log | dt_bias | other parameters, largest |")
    print("|---|---|---|---|---|---|")
    for d_model, n_heads in SHAPES:
        config = ModelConfig(vocab_size=16, d_model=d_model, n_heads=n_heads, max_seq_len=SEQ_LEN,
                             mixer="gated_delta_net")
        torch.manual_seed(0)
        module = MIXERS["gated_delta_net"](config, 0)
        leakage.use_backend(module, "torch")
        x = torch.randn(ROWS, SEQ_LEN, d_model)
        upstream = torch.randn_like(x)
        for autocast in (False, True):
            plain = _grads(module, x, upstream, autocast)
            for name, hooks in EMULATIONS.items():
                fla_ops._chunked_gated_delta_rule = functools.partial(shipped, **hooks)
                try:
                    emulated = _grads(module, x, upstream, autocast)
                finally:
                    fla_ops._chunked_gated_delta_rule = shipped
                others = max(_rel(emulated[n], plain[n]) for n in plain if n not in ("a_log", "dt_bias"))
                print(f"| {d_model}, {n_heads} | {name} | {'bf16' if autocast else 'off'} | "
                      f"{_rel(emulated['a_log'], plain['a_log']):.1e} | "
                      f"{_rel(emulated['dt_bias'], plain['dt_bias']):.1e} | {others:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
