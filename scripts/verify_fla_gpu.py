"""Verify the fla-core baselines on a CUDA GPU: fla's Triton kernels against the plain-torch path the CPU runs.

    python scripts/verify_fla_gpu.py             # every check, about a minute on an H200
    python scripts/verify_fla_gpu.py --only ops  # ops | stack | mixers | leakage
    python scripts/verify_fla_gpu.py --only ops --forms recurrent   # the fused recurrent kernels only
    python scripts/verify_fla_gpu.py --recurrent-max-t 1024   # stack, mixers, leakage on the recurrent kernels

ops:     every op of ``models.mixers.fla_ops`` forward and backward (random upstream gradient) through fla's
         kernels (chunked, and fused recurrent where the op has that form) and through the torch path (fla's
         naive functions, per document), with and without ``cu_seqlens``, at the lab's small head sizes (padded
         for the kernels) and at head size 64; fp32 and bf16 inputs. Relative RMS error of the output and of
         every input gradient against the torch path on the same inputs in fp32, PASS below 5e-3 (fp32: the
         kernels' dot products may run in tf32) or 2e-2 (bf16).
stack:   the op under ``torch.func.vmap`` (its per-run rule) equals the op run once per run, bitwise.
mixers:  every baseline mixer (MAD width 128 with 16 heads, and width 64 with 4) with kernel_backend "triton"
         against the same weights on "torch", forward and parameter gradients, with and without documents; in
         fp32, and at the first width also under bf16 autocast as training runs them. There a tensor's bound is
         the larger of the bf16 bound and autocast's own shift of the torch path (bf16 against fp32, printed
         first): the gradient of a decay parameter sums many terms of both signs, and autocast alone moves the
         gated delta net's by ~9% on the CPU at width 32 (under 1% on the H200 at width 128).
leakage: ``mixlab leakage`` on CUDA through the kernels: the perturbation, NaN and gradient probes must hold
         bitwise (a leak of an fla kernel across documents is a finding: the row names the mixer), packing
         invariance is printed.
Where fla-core refuses its gated backward (``fla_ops.gated_backward_refused``: Hopper with Triton 3.4-3.7.0)
simple_gla is checked on the GLA kernel it runs on there, and the gated delta rule on fla's kernels with the
refused piece in the lab's plain torch (``models/mixers/fla_dqkwg.py``), which these checks cover end to end.
Prints one line per case (with its seconds: the first call of an fla kernel at a new shape autotunes it, which
can take minutes with ``--autotune full``; the default, the library's, keeps only the first config of every fla
autotuner, ``models.mixers.fla_ops``).
A stalled case shows up as the Python stack dumped every ``--stack-every`` seconds (autotuning: frames in
``triton/runtime/autotuner.py``; a hung kernel: a synchronising call). Exit status 1 on any failure, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from mixlab.analysis import leakage
from mixlab.models import MIXERS, ModelConfig
from mixlab.models.mixers import fla_ops
from mixlab.runners.bench.utils import error_line, rel_rms

DEVICE = "cuda"
QKV = ("q", "k", "v")
FLA_MIXERS = [name for name, cls in MIXERS.items() if cls.__module__.endswith(".fla")]
BOUND = {torch.float32: 5e-3, torch.bfloat16: 2e-2}
DTYPE_NAME = {torch.float32: "fp32", torch.bfloat16: "bf16 autocast"}
OP_SHAPES = [(2, 100, 4, 8, 8), (2, 256, 4, 64, 64)]  # B, T, H, K, V
MIXER_SHAPES = [(128, 16), (64, 4)]  # d_model, n_heads
ROWS, SEQ_LEN = 4, 256


def random_layout(rows: int, seq_len: int, seed: int, empty: bool = True) -> torch.Tensor:
    """cu_seqlens of random documents (lengths 1 to 80) filling ``rows`` rows of ``seq_len`` tokens, with one
    empty document (a repeated offset) at the start when ``empty``."""
    rng = np.random.default_rng(seed)
    offsets = [0, 0] if empty else [0]
    for row in range(rows):
        t = 0
        while (t := t + int(rng.integers(1, 81))) < seq_len:
            offsets.append(row * seq_len + t)
        offsets.append((row + 1) * seq_len)
    return torch.tensor(offsets, dtype=torch.int32, device=DEVICE)


def op_inputs(op: str, shape: tuple, dtype: torch.dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    B, T, H, K, V = shape

    def randn(*size):
        return torch.randn(*size, generator=gen, device=DEVICE)

    q, k, v = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H, V)
    inputs = {"q": q, "k": k, "v": v}
    if op == "gla":
        inputs["g"] = F.logsigmoid(randn(B, T, H, K)) / 16
    if op in ("simple_gla", "gated_delta_rule"):
        inputs["g"] = F.logsigmoid(randn(B, T, H))
    if op == "gated_delta_rule":
        inputs["q"], inputs["k"] = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        inputs["beta"] = torch.rand(B, T, H, generator=gen, device=DEVICE)
    return {name: t.to(dtype) if name in QKV else t for name, t in inputs.items()}


def op_fwd_bwd(op: str, inputs: dict, upstream: torch.Tensor, cu: torch.Tensor | None,
               backend: str) -> list[torch.Tensor]:
    leaves = {name: t.detach().clone().requires_grad_() for name, t in inputs.items()}
    q, k, v = leaves.pop("q"), leaves.pop("k"), leaves.pop("v")
    o = fla_ops.linear_attention(op, q, k, v, cu_seqlens=cu, backend=backend, **leaves)
    return [o, *torch.autograd.grad(o, [q, k, v, *leaves.values()], upstream)]


def report(label: str, names: list[str], got: list[torch.Tensor], want: list[torch.Tensor],
           bound: float | list[float], started: float) -> bool:
    """One PASS/FAIL line: relative RMS error of each tensor against its bound (one for all, or one each)."""
    errors = {n: rel_rms(a.float(), b.float()) for n, a, b in zip(names, got, want, strict=True)}
    bounds = [bound] * len(names) if isinstance(bound, float) else bound
    ok = all(e <= b for e, b in zip(errors.values(), bounds, strict=True))  # a NaN error fails too
    detail = " ".join(f"{n}={e:.1e}" for n, e in errors.items())
    print(f"{'PASS' if ok else 'FAIL'}  {label}: {detail}  ({time.perf_counter() - started:.1f} s)", flush=True)
    return ok


def check_ops(forms: tuple[str, ...] = fla_ops.FORMS) -> bool:
    shipped, ok = fla_ops.RECURRENT_MAX_T, True
    for op, form in [(op, form) for op in fla_ops.OPS for form in forms
                     if form == "chunk" or op in fla_ops.RECURRENT_OPS]:
        limit = 0 if form == "chunk" else max(shape[1] for shape in OP_SHAPES)
        fla_ops.RECURRENT_MAX_T = dict.fromkeys(fla_ops.RECURRENT_OPS, limit)
        for shape in OP_SHAPES:
            for dtype in BOUND:
                for docs in ("none", "varlen", "varlen+empty"):
                    started = time.perf_counter()
                    gen = torch.Generator(device=DEVICE).manual_seed(0)
                    inputs = op_inputs(op, shape, dtype, gen)
                    cu = None if docs == "none" else random_layout(shape[0], shape[1], 1, empty=docs.endswith("empty"))
                    upstream = torch.randn(*shape[:3], shape[4], generator=gen, device=DEVICE).to(dtype)
                    label = f"op {op} {form} B,T,H,K,V={shape} {str(dtype)[6:]} docs={docs}"
                    try:
                        got = op_fwd_bwd(op, inputs, upstream, cu, "triton")
                    except Exception as error:  # noqa: BLE001 - one line per failed case, then the next case
                        print(f"FAIL  {label}: {error_line(error)}", flush=True)
                        ok = False
                        continue
                    as32 = {n: t.float() for n, t in inputs.items()}
                    want = op_fwd_bwd(op, as32, upstream.float(), cu, "torch")
                    names = ["o"] + [f"d{n}" for n in inputs]  # q, k, v, then the gates
                    ok &= report(label, names, got, want, BOUND[dtype], started)
    fla_ops.RECURRENT_MAX_T = shipped
    return ok


def check_stack() -> bool:
    ok = True
    for op in fla_ops.OPS:
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        runs = [op_inputs(op, OP_SHAPES[0], torch.float32, gen) for _ in range(3)]
        stacked = {n: torch.stack([r[n] for r in runs]) for n in runs[0]}

        def one(inputs: dict, op: str = op) -> torch.Tensor:
            rest = {n: t for n, t in inputs.items() if n not in QKV}
            return fla_ops.linear_attention(op, inputs["q"], inputs["k"], inputs["v"], backend="triton", **rest)

        batched = torch.func.vmap(one)(stacked)
        alone = torch.stack([one(r) for r in runs])
        same = torch.equal(batched, alone)
        print(f"{'PASS' if same else 'FAIL'}  stack {op}: vmap of 3 runs == 3 runs alone (bitwise)", flush=True)
        ok &= same
    return ok


def mixer_fwd_bwd(module: torch.nn.Module, x: torch.Tensor, cu: torch.Tensor | None,
                  upstream: torch.Tensor) -> list[torch.Tensor]:
    module.zero_grad()
    y = module(x, cu_seqlens=cu)
    y.backward(upstream)
    return [y.detach(), *(p.grad.clone() for p in module.parameters())]


def check_mixers() -> bool:
    ok = True
    for name in FLA_MIXERS:
        for d_model, n_heads in MIXER_SHAPES:
            config = ModelConfig(vocab_size=16, d_model=d_model, n_heads=n_heads, max_seq_len=SEQ_LEN, mixer=name)
            torch.manual_seed(0)
            module = MIXERS[name](config, 0).to(DEVICE)
            x = torch.randn(ROWS, SEQ_LEN, d_model, device=DEVICE)
            upstream = torch.randn_like(x)
            # bf16 autocast as training runs it (at the first shape): the mixers' tensors reach the op in mixed
            # dtypes there (the gated delta net's normalised q, k in fp32 beside a bf16 v)
            dtypes = (torch.float32, torch.bfloat16) if (d_model, n_heads) == MIXER_SHAPES[0] else (torch.float32,)
            names = ["y"] + [f"d{n}" for n, _ in module.named_parameters()]
            results = {}
            for dtype in dtypes:
                for docs in (False, True):
                    started = time.perf_counter()
                    cu = random_layout(ROWS, SEQ_LEN, seed=2) if docs else None
                    for backend in ("triton", "torch"):
                        leakage.use_backend(module, backend)
                        with torch.autocast(DEVICE, dtype=dtype, enabled=dtype != torch.float32):
                            results[backend, dtype, docs] = mixer_fwd_bwd(module, x, cu, upstream)
                    label = f"mixer {name} d_model={d_model} n_heads={n_heads} {DTYPE_NAME[dtype]} docs={docs}"
                    bound = BOUND[dtype]
                    if dtype != torch.float32:  # autocast's own shift of the torch path, tensor by tensor
                        shift = [rel_rms(a.float(), b.float()) for a, b in
                                 zip(results["torch", dtype, docs], results["torch", torch.float32, docs])]
                        bound = [max(bound, s) for s in shift]
                        print(f"      torch {DTYPE_NAME[dtype]} against torch fp32: "
                              + " ".join(f"{n}={e:.1e}" for n, e in zip(names, shift)), flush=True)
                    ok &= report(label, names, results["triton", dtype, docs], results["torch", dtype, docs],
                                 bound, started)
    return ok


def check_leakage() -> bool:
    reports = [leakage.probe_mixer(name, device=DEVICE, backend="triton") for name in FLA_MIXERS]
    print(leakage.format_table(reports), flush=True)
    return all(r.perturbation and r.nan and r.gradient for r in reports)


CHECKS = {"ops": check_ops, "stack": check_stack, "mixers": check_mixers, "leakage": check_leakage}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=list(CHECKS), help="run one group of checks")
    parser.add_argument("--autotune", choices=fla_ops.AUTOTUNE_MODES, default=None,
                        help="as MIXLAB_FLA_AUTOTUNE (default: it, else first): first keeps every fla autotuner's "
                             "first config only, full lets fla tune")
    parser.add_argument("--stack-every", type=float, default=120.0, help="dump the Python stack every N seconds")
    parser.add_argument("--forms", default=",".join(fla_ops.FORMS),
                        help="comma-separated kernel forms the ops check covers (default: every form)")
    parser.add_argument("--recurrent-max-t", type=int, default=None,
                        help="fla_ops.RECURRENT_MAX_T of every recurrent op for the stack, mixer and leakage checks "
                             "(default: shipped)")
    args = parser.parse_args()
    forms = tuple(f.strip() for f in args.forms.split(","))
    if not set(forms) <= set(fla_ops.FORMS):
        parser.error(f"unknown form in --forms {args.forms!r}; choose from {', '.join(fla_ops.FORMS)}")
    CHECKS["ops"] = functools.partial(check_ops, forms)
    faulthandler.dump_traceback_later(args.stack_every, repeat=True)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        sys.exit(2)
    if not fla_ops.fla_available():
        print(f"fla-core is not installed: {fla_ops.INSTALL_HINT}", file=sys.stderr)
        sys.exit(2)
    refused = fla_ops.gated_backward_refused()
    print(f"fla refuses its gated chunk_bwd_dqkwg here: {refused}"
          + (" (the lab's plain-torch one stands in, models/mixers/fla_dqkwg.py)" if refused else ""), flush=True)
    if args.autotune is not None:
        os.environ["MIXLAB_FLA_AUTOTUNE"] = args.autotune
    if args.recurrent_max_t is not None:
        fla_ops.RECURRENT_MAX_T = dict.fromkeys(fla_ops.RECURRENT_OPS, args.recurrent_max_t)
    print(f"rows of at most these many tokens on fla's fused recurrent kernels: {fla_ops.RECURRENT_MAX_T}", flush=True)
    fla_ops.load_fla()
    print(f"fla autotune {fla_ops.autotune_mode()}: {len(fla_ops.fla_autotuners())} autotuners", flush=True)
    results = [check() for name, check in CHECKS.items() if args.only in (None, name)]
    print("ALL PASS" if all(results) else "FAILURES above")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
