"""Verify the Triton short-convolution kernels on a CUDA GPU against the float64 torch reference.

    python scripts/verify_shortconv_gpu.py            # every check, a few minutes on an H200
    python scripts/verify_shortconv_gpu.py --quick    # the B=4, T=4096, D=2048 cases only
    python scripts/verify_shortconv_gpu.py --only checks  # determinism, blindness, stacking, torch.compile only
    python scripts/verify_shortconv_gpu.py --set short_conv.FWD_STREAM=True  # a setting before it ships

Each case runs the Triton op forward and backward with a random upstream gradient, and the reference in
float64 on the same (rounded) inputs; it prints the relative RMS error of the output and of every input
gradient with PASS/FAIL against 1e-5 (fp32), 1e-2 (bf16), 2e-3 (fp16). Every buffer the launchers allocate
starts full of NaN, so an element a kernel never writes fails. Then: bitwise determinism of two runs,
document blindness (NaN in one document, the others bitwise equal), stacked runs under vmap (folded into one
launch) bitwise each run alone, and torch.compile(fullgraph=True) with inductor against eager.
Exit status 1 on any failure, 2 without CUDA.
"""

import argparse
import sys
import time

import numpy as np
import torch
import triton
from mixlab import kernels
from mixlab.kernels import triton_utils as tu
from mixlab.kernels.dynamic_conv import triton_headwise, triton_lowrank
from mixlab.kernels.dynamic_conv.naive import dynamic_conv_headwise_ref, dynamic_conv_lowrank_ref
from mixlab.kernels.short_conv import triton as short_conv
from mixlab.kernels.short_conv.naive import short_conv_ref
from mixlab.runners.bench.utils import rel_rms
from tuning import set_constants

DEVICE = "cuda"
LARGE = (4, 4096, 2048, 4)  # B, T, D, W of the targets
BOUND = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
OPS = {
    "static": (kernels.short_conv, short_conv_ref),
    "headwise": (kernels.dynamic_conv_headwise, dynamic_conv_headwise_ref),
    "lowrank": (kernels.dynamic_conv_lowrank, dynamic_conv_lowrank_ref),
}


def layout(B: int, T: int, kind: str, seed: int) -> torch.Tensor | None:
    """cu_seqlens of a layout: none (one document a row), docs64 (64 random documents), short (lengths 0-9,
    many below W, zeros are empty documents)."""
    if kind == "none":
        return None
    rng = np.random.default_rng(seed)
    offsets = [0]
    for row in range(B):
        if kind == "docs64":
            n = 64 // B + (row < 64 % B)
            k = min(n - 1, T - 1)
            cuts = sorted(rng.choice(np.arange(1, T), size=k, replace=False).tolist()) if k > 0 else []
        else:
            cuts, t = [], 0
            while True:
                t += int(rng.integers(0, 10))  # 0: an empty document
                if t >= T:
                    break
                cuts.append(t)
        offsets += [row * T + c for c in cuts] + [(row + 1) * T]
    return torch.tensor(offsets, dtype=torch.int32, device=DEVICE)


def make_inputs(op: str, B: int, T: int, D: int, W: int, size: int, static: bool, dtype, param_dtype, gen):
    """Inputs of an op; ``size`` is the head size (headwise) or the rank (lowrank)."""

    def randn(*shape, scale=1.0, dt=dtype):
        return (scale * torch.randn(*shape, generator=gen, device=DEVICE)).to(dt)

    x = randn(B, T, D)
    static_w = randn(W, D, scale=W**-0.5, dt=param_dtype) if static else None
    if op == "static":
        return {"x": x, "weight": randn(W, D, scale=W**-0.5, dt=param_dtype)}
    if op == "headwise":
        return {"x": x, "weight": randn(B, T, D // size, W, scale=W**-0.5), "static_w": static_w}
    U = randn(size, W * D, scale=(size * W) ** -0.5, dt=param_dtype)
    return {"x": x, "z": randn(B, T, size), "U": U, "static_w": static_w}


def fwd_bwd(fn, inputs: dict, upstream: torch.Tensor, **kwargs) -> list[torch.Tensor]:
    leaves = {k: None if v is None else v.detach().clone().requires_grad_() for k, v in inputs.items()}
    y = fn(**leaves, **kwargs)
    return [y, *torch.autograd.grad(y, [v for v in leaves.values() if v is not None], upstream)]


def check_case(op, B, T, D, W, size, docs, static, residual, dtype, param_dtype=None, seed=0) -> bool:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    param_dtype = param_dtype or dtype
    cu = layout(B, T, docs, seed)
    inputs = make_inputs(op, B, T, D, W, size, static, dtype, param_dtype, gen)
    upstream = torch.randn(B, T, D, generator=gen, device=DEVICE).to(dtype)
    public, ref = OPS[op]
    start = time.perf_counter()
    got = fwd_bwd(public, inputs, upstream, cu_seqlens=cu, residual=residual, backend="triton")
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    as64 = {k: None if v is None else v.double() for k, v in inputs.items()}
    want = fwd_bwd(ref, as64, upstream.double(), cu_seqlens=cu, residual=residual)
    names = ["y"] + [f"d{k}" for k, v in inputs.items() if v is not None]
    errors = {n: rel_rms(a, b) for n, a, b in zip(names, got, want, strict=True)}
    dtypes_ok = got[0].dtype == dtype and all(
        g.dtype == v.dtype
        for g, v in zip(got[1:], [v for v in inputs.values() if v is not None], strict=True)
    )
    ok = dtypes_ok and all(e <= BOUND[dtype] for e in errors.values())
    extra = {"headwise": f" hs={size}", "lowrank": f" R={size}"}.get(op, "")
    label = f"{op}{extra} B={B} T={T} D={D} W={W} docs={docs} static={static} residual={residual} "
    label += NAMES[dtype] + (f"/params {NAMES[param_dtype]}" if param_dtype != dtype else "")
    detail = " ".join(f"{n}={e:.1e}" for n, e in errors.items())
    verdict = "PASS" if ok else "FAIL"
    print(f"{verdict}  {label}: {detail}{'' if dtypes_ok else ' WRONG DTYPES'} ({seconds:.2f}s)")
    return ok


def large_cases() -> list[tuple]:
    B, T, D, W = LARGE
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        for docs in ("none", "docs64"):
            cases += [
                ("static", B, T, D, W, 0, docs, False, True, dtype),
                ("headwise", B, T, D, W, 1, docs, True, True, dtype),
                ("headwise", B, T, D, W, 16, docs, True, True, dtype),
                ("lowrank", B, T, D, W, 16, docs, True, True, dtype),
            ]
    return cases


def odd_cases() -> list[tuple]:
    f32, b16, f16 = torch.float32, torch.bfloat16, torch.float16
    cases = []
    for W in range(1, 9):
        dtype = f32 if W % 2 else b16
        cases += [
            ("static", 3, 1000, 771, W, 0, "short", False, W % 3 == 0, dtype),
            ("headwise", 3, 1000, 768, W, 2 ** (W % 5), "short", W % 2 == 0, True, dtype),
            ("lowrank", 3, 1000, 771, W, 8 if W % 2 else 16, "short", W % 2 == 0, W % 3 == 0, dtype),
        ]
    for hs in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        cases.append(("headwise", 2, 1031, 1024, 4, hs, "docs64", True, False, b16 if hs % 3 else f32))
    for R in (1, 8, 16, 20, 32, 64):
        cases.append(("lowrank", 2, 1031, 1000, 4, R, "docs64", True, False, f32 if R % 2 else b16))
    for dtype in (f32, b16):
        for op, size in (("static", 0), ("headwise", 1), ("lowrank", 16)):
            cases += [
                (op, 1, 1, 1, 4, size, "none", True, True, dtype),
                (op, 2, 63, 65, 4, size, "short", True, False, dtype),
                (op, 2, 65, 63, 3, size, "short", False, True, dtype),
                (op, 2, 127, 127, 8, size, "docs64", True, True, dtype),
                (op, 7, 4096, 2048, 4, size, "docs64", True, True, dtype),
            ]
    for op, size in (("static", 0), ("headwise", 16), ("lowrank", 16)):
        cases.append((op, 4, 2048, 2048, 4, size, "docs64", True, True, f16))
    return cases


def mixed_cases() -> list[tuple]:
    """bf16 activations with fp32 parameters, as the models pass them under autocast."""
    return [
        ("static", 4, 4096, 2048, 4, 0, "docs64", False, True, torch.bfloat16, torch.float32),
        ("headwise", 4, 4096, 2048, 4, 8, "docs64", True, True, torch.bfloat16, torch.float32),
        ("lowrank", 4, 4096, 2048, 4, 16, "docs64", True, True, torch.bfloat16, torch.float32),
    ]


def check_determinism() -> bool:
    ok = True
    B, T, D, W = LARGE
    for op, size in (("static", 0), ("headwise", 1), ("headwise", 16), ("lowrank", 16)):
        gen = torch.Generator(device=DEVICE).manual_seed(5)
        inputs = make_inputs(op, B, T, D, W, size, True, torch.bfloat16, torch.bfloat16, gen)
        upstream = torch.randn(B, T, D, generator=gen, device=DEVICE).to(torch.bfloat16)
        cu = layout(B, T, "docs64", 5)
        runs = [fwd_bwd(OPS[op][0], inputs, upstream, cu_seqlens=cu, residual=True, backend="triton")
                for _ in range(2)]  # fmt: skip
        same = all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
        print(f"{'PASS' if same else 'FAIL'}  determinism {op} size={size}: two fwd+bwd runs bitwise equal")
        ok &= same
    return ok


def check_blindness() -> bool:
    ok = True
    B, T, D, W = LARGE
    cu = layout(B, T, "docs64", 6)
    starts, ends = cu[:-1].tolist(), cu[1:].tolist()
    j = max(range(len(starts)), key=lambda i: ends[i] - starts[i])  # the longest document
    flat = torch.arange(B * T, device=DEVICE)
    inside = ((flat >= starts[j]) & (flat < ends[j])).view(B, T)
    token_inputs = {"static": ("x",), "headwise": ("x", "weight"), "lowrank": ("x", "z")}
    for op, size in (("static", 0), ("headwise", 4), ("lowrank", 16)):
        gen = torch.Generator(device=DEVICE).manual_seed(6)
        inputs = make_inputs(op, B, T, D, W, size, True, torch.bfloat16, torch.bfloat16, gen)
        before = OPS[op][0](**inputs, cu_seqlens=cu, residual=True, backend="triton")
        changed = dict(inputs)
        for name in token_inputs[op]:
            t = inputs[name]
            mask = inside.view(B, T, *[1] * (t.dim() - 2))
            changed[name] = torch.where(mask, torch.full_like(t, float("nan")), t)
        after = OPS[op][0](**changed, cu_seqlens=cu, residual=True, backend="triton")
        same = torch.equal(before[~inside], after[~inside]) and bool(torch.isnan(after[inside]).all())
        print(f"{'PASS' if same else 'FAIL'}  blindness {op}: NaN in one document, the others bitwise equal")
        ok &= same
    return ok


def check_stacked() -> bool:
    """Stacked runs under torch.func.vmap (the engine's stacks, no documents): one folded launch, each run's
    output and gradients bitwise those of the run alone, bf16 activations, fp32 weights."""
    ok = True
    N, B, T, D, W = 6, 8, 512, 384, 4
    for op, size in (("static", 0), ("headwise", 8), ("lowrank", 16)):
        gen = torch.Generator(device=DEVICE).manual_seed(8)
        runs = [make_inputs(op, B, T, D, W, size, True, torch.bfloat16, torch.float32, gen) for _ in range(N)]
        names = list(runs[0])
        stacked = {k: torch.stack([r[k] for r in runs]) for k in names}
        upstream = torch.randn(N, B, T, D, generator=gen, device=DEVICE).to(torch.bfloat16)

        def conv(*tensors, fn=OPS[op][0], names=tuple(names)):
            return fn(**dict(zip(names, tensors, strict=True)), residual=True, backend="triton")

        leaves = [stacked[k].clone().requires_grad_() for k in names]
        y = torch.func.vmap(conv)(*leaves)
        grads = torch.autograd.grad(y, leaves, upstream)
        same = True
        for n in range(N):
            alone = [runs[n][k].clone().requires_grad_() for k in names]
            y_n = conv(*alone)
            same &= torch.equal(y[n], y_n)
            same &= all(torch.equal(g[n], a) for g, a in zip(grads, torch.autograd.grad(y_n, alone, upstream[n]),
                                                            strict=True))
        print(f"{'PASS' if same else 'FAIL'}  stacked {op}: {N} runs in one launch, each bitwise the run alone")
        ok &= same
    return ok


def check_compile() -> bool:
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    B, T, D, W, R = 2, LARGE[1] // 4, LARGE[2] // 4, 4, 16
    H = D // 8
    w, s = torch.randn(W, D, generator=gen, device=DEVICE), torch.randn(W, D, generator=gen, device=DEVICE)
    U = torch.randn(R, W * D, generator=gen, device=DEVICE) / 8
    x = torch.randn(B, T, D, generator=gen, device=DEVICE)
    hw = torch.randn(B, T, H, W, generator=gen, device=DEVICE)
    z = torch.randn(B, T, R, generator=gen, device=DEVICE)
    cu = layout(B, T, "docs64", 7)

    def model(x, hw, z):
        y = kernels.short_conv(x, w, cu_seqlens=cu, residual=True, backend="triton")
        y = kernels.dynamic_conv_headwise(torch.sin(y), hw, s, cu_seqlens=cu, backend="triton")
        return kernels.dynamic_conv_lowrank(y, z, U, s, cu_seqlens=cu, backend="triton").square().mean()

    results = []
    for fn in (model, torch.compile(model, fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in (x, hw, z)]
        loss = fn(*leaves)
        results.append([loss, *torch.autograd.grad(loss, leaves)])
    errors = [rel_rms(a, b) for a, b in zip(results[1], results[0], strict=True)]
    ok = all(e <= 1e-5 for e in errors)
    detail = " ".join(f"{e:.1e}" for e in errors)
    print(f"{'PASS' if ok else 'FAIL'}  torch.compile(fullgraph=True) vs eager, loss and gradients: {detail}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the B=4, T=4096, D=2048 cases")
    parser.add_argument("--only", choices=["cases", "checks"], help="only the per-case errors, or only "
                        "determinism, blindness and torch.compile (the full script can outlast one device call)")
    parser.add_argument("--start", type=int, default=0, help="skip the first cases (a run that an earlier call's "
                        "limit cut off goes on from the case it reached)")
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.CONSTANT=VALUE",
                        help="set a kernel constant first (modules short_conv, triton_headwise, triton_lowrank)")
    args = parser.parse_args()
    error = set_constants(args.set, {"short_conv": short_conv, "triton_headwise": triton_headwise,
                                     "triton_lowrank": triton_lowrank})
    if error:
        print(f"verify_shortconv_gpu: {error}", file=sys.stderr)
        return 2
    if args.set:
        print("set: " + ", ".join(args.set))
    if not torch.cuda.is_available():
        print("verify_shortconv_gpu: no CUDA device", file=sys.stderr)
        return 2
    tu.POISON_OUTPUTS = True  # every launcher buffer starts full of NaN
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}, Triton {triton.__version__}, "
          f"CUDA {torch.version.cuda}")  # fmt: skip
    cases = large_cases() if args.quick else large_cases() + odd_cases() + mixed_cases()
    results = [] if args.only == "checks" else [check_case(*case, seed=i) for i, case in enumerate(cases)
                                                if i >= args.start]
    if not args.quick and args.only != "cases":
        results += [check_determinism(), check_blindness(), check_stacked(), check_compile()]
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
