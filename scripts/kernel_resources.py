"""Registers, spills, shared memory and layout moves of the Triton kernels as compiled for an H200, on a machine
without a GPU.

    python scripts/kernel_resources.py [--ops shortconv,attention,rubiconv] [--arch 90]
    python scripts/kernel_resources.py --ops shortconv --config "headwise[bwd,tiled,hs1].tile=1024"
    python scripts/kernel_resources.py --ops shortconv --calls low-rank   # only the calls so labelled

The launchers run on CPU tensors at the shapes of ``mixlab bench profile ncu`` (short convs B=4,
T=4096, D=2048, W=4, bf16, without and with 64 documents; attention a stack of 18 MAD runs at T=127 and 1023;
RubiConv forward and backward on one row of 65,536 tokens in 49 documents, D=1024, fp32 and bf16), at the
launch settings the GPU takes (each kernel module's ``config_for``, with ``--config`` replacing fields of a
table row: ``MODULE[KEY].FIELD=VALUE``, KEY the row's key comma-separated), but every kernel launch is
intercepted: the kernel is specialised exactly as Triton's launcher would specialise it (argument types, 16-byte
divisibility, constants), compiled for ``sm_<arch>a`` and assembled by Triton's own ptxas, whose report gives
registers a thread and spilled bytes. Nothing runs. "Layout moves"
counts the ``convert_layout`` operations of the kernel's TritonGPU IR: each moves a tile between two register
layouts, through shared memory with a barrier unless the two are close, and one inside a loop over taps or
tiles runs at every iteration (a dot's operands and result are moves no kernel avoids). "In loops" counts the
warp shuffles and barriers of the PTX inside its loops (a backward branch's span): a reduction across the
threads of a tile there (shuffles, then shared memory behind barriers) runs at every tile. "Loads in loops"
counts the global load instructions there by the bytes each thread reads: a gather whose addresses are not
contiguous within a thread compiles to one 2-byte load per bf16 element, each warp's request spanning several
cache lines, where contiguous ones take one 8- or 16-byte load.

Occupancy follows from the registers: an SM holds 65,536 of them and at most 64 warps, so a kernel of ``r``
registers and ``w`` warps a block fits ``min(64 // w, 65536 // (r * 32 * w))`` blocks (shared memory permitting).

The figures are the installed Triton's: they match the GPU's only when its version is the GPU image's (the lent
H200 has Triton 3.6; ``pip install --target DIR triton==3.6.0`` and ``PYTHONPATH=DIR`` give it here). The
kernels' timings need the GPU (``mixlab bench shortconv``); this says what a tile choice costs in registers.
"""

import argparse
import ast
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import contextmanager

os.environ["TRITON_INTERPRET"] = "0"  # compile for real: the interpreter has no registers to count

import torch  # noqa: E402
import triton  # noqa: E402
from mixlab.kernels.attention import triton as attn  # noqa: E402
from mixlab.kernels.dynamic_conv import triton_headwise, triton_lowrank  # noqa: E402
from mixlab.kernels.rubiconv import gemm  # noqa: E402
from mixlab.kernels.rubiconv import triton as rubi  # noqa: E402
from mixlab.kernels.short_conv import triton as short_conv  # noqa: E402
from mixlab.runners.bench.rubiconv import lognormal_layout  # noqa: E402
from mixlab.runners.bench.shortconv import _doc_layout, _kernels  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

MAX_REGS, MAX_WARPS = 65536, 64  # per SM, sm_90
MODULES = {"short_conv": short_conv, "headwise": triton_headwise, "lowrank": triton_lowrank, "attention": attn,
           "rubiconv": rubi}


def parse_configs(items: list[str]) -> dict:
    """``["headwise[bwd,tiled,hs1].tile=1024", ...]`` -> {(module name, row key): {field: value}}; ValueError names
    a bad item (unknown module, row or field; a value that is not a Python literal)."""
    overrides: dict = {}
    for item in items:
        target, _, value = item.partition("=")
        name, _, rest = target.partition("[")
        key_text, _, field = rest.partition("].")
        if name not in MODULES or not field or not value:
            raise ValueError(f"--config expects MODULE[KEY].FIELD=VALUE (modules: {', '.join(MODULES)}), got {item!r}")
        parts = tuple(int(p) if p.isdigit() else p for p in key_text.split(","))
        key = parts[0] if len(parts) == 1 else parts
        if key not in MODULES[name].CONFIGS:
            rows = ", ".join(map(repr, MODULES[name].CONFIGS))
            raise ValueError(f"{item!r}: {name} has no row {key!r}; rows: {rows}")
        try:
            fields = {**overrides.get((name, key), {}), field: ast.literal_eval(value)}
            dataclasses.replace(MODULES[name].CONFIGS[key], **fields)
        except (ValueError, SyntaxError, TypeError) as exc:
            raise ValueError(f"{item!r}: {exc}") from None
        overrides[name, key] = fields
    return overrides


def setting(overrides: dict, module, row):
    """The launch setting of a table row (as ``config_for`` returned it), with its ``--config`` fields replaced."""
    name = next(n for n, m in MODULES.items() if m is module)
    key = next(k for k, v in module.CONFIGS.items() if v is row)
    return dataclasses.replace(row, **overrides.get((name, key), {}))


def _compile(fn: JITFunction, target: GPUTarget, args: tuple, kwargs: dict) -> dict:
    """Specialise fn on these launch arguments as Triton's launcher does, compile it for target, assemble the
    PTX with ptxas -v: {name, warps, registers, spill, shared, moves}."""
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        arch = f"sm_{target.arch}a"
        report = subprocess.run([get_ptxas(target.arch).path, "-v", f"--gpu-name={arch}", ptx, "-o", ptx + ".cubin"],
                                capture_output=True, text=True, check=True).stderr
    spill = re.search(r"(\d+) bytes spill stores", report)
    return {"name": fn.__name__, "warps": kernel.metadata.num_warps,
            "registers": int(re.search(r"Used (\d+) registers", report).group(1)),
            "spill": int(spill.group(1)) if spill else 0, "shared": kernel.metadata.shared,
            "moves": kernel.asm["ttgir"].count("ttg.convert_layout"), **_in_loops(kernel.asm["ptx"])}


def _in_loops(ptx: str) -> dict:
    """Warp shuffles and barriers inside the PTX's loops: lines between a label and a later branch back to it
    (nested loops counted once)."""
    lines = ptx.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*(\$L__\w+):", line))}
    inside = set()
    for i, line in enumerate(lines):
        m = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)
        if m and labels.get(m.group(1), i) < i:
            inside.update(range(labels[m.group(1)], i))
    body = [lines[i] for i in sorted(inside)]
    # global loads by bytes a thread: ld.global[.v2|.v4].b16/b32/... ; a narrow load per element where a wide one
    # would do (addresses not contiguous in a thread) multiplies the L1 requests a tile makes
    widths: dict[int, int] = {}
    for line in body:
        m = re.search(r"\bld\.global(?:\.\w+)*?(?:\.v(\d))?\.[bfsu](\d+)\b", line)
        if m:
            size = int(m.group(1) or 1) * int(m.group(2)) // 8
            widths[size] = widths.get(size, 0) + 1
    return {"loop_shuffles": sum("shfl.sync" in line for line in body),
            "loop_barriers": sum(bool(re.search(r"\b(bar|barrier)\.sync", line)) for line in body),
            "loop_loads": ", ".join(f"{n} x {size} B" for size, n in sorted(widths.items())) or "-"}


@contextmanager
def intercepted(target: GPUTarget, out: list[dict]):
    """Within: every ``kernel[grid](...)`` compiles instead of launching, its report appended to out."""
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        out.append(_compile(self, target, args, kwargs))

    JITFunction.run = compile_only
    try:
        yield
    finally:
        JITFunction.run = run


def _shortconv_settings(kind: str, inputs: dict, overrides: dict) -> tuple[dict, dict]:
    """The keyword arguments of a short conv's forward and backward launchers at the GPU's routing."""
    W = inputs["weight"].shape[-1] if kind == "headwise" else inputs["weight"].shape[-2] if kind == "static" else None
    if kind == "static":
        rows = short_conv.config_for(False, W, False), short_conv.config_for(True, W, False)
        return {"config": setting(overrides, short_conv, rows[0])}, {"config": setting(overrides, short_conv, rows[1])}
    if kind == "headwise":
        H, D = inputs["weight"].shape[2], inputs["x"].shape[2]
        rows = triton_headwise.config_for(False, H, D, W, False), triton_headwise.config_for(True, H, D, W, False)
        return ({"config": setting(overrides, triton_headwise, rows[0])},
                {"config": setting(overrides, triton_headwise, rows[1])})
    return ({"config": setting(overrides, triton_lowrank, triton_lowrank.config_for("fwd"))},
            {f"{launch}_config": setting(overrides, triton_lowrank, triton_lowrank.config_for(launch))
             for launch in ("dx", "dz", "du")})


def shortconv_cases(overrides: dict, B: int = 4, T: int = 4096, D: int = 2048, W: int = 4, n_docs: int = 64
                    ) -> list[tuple[str, Callable]]:
    """``bench shortconv``'s ops and inputs, each through its TritonOp's launchers (forward, then backward)."""
    cpu = torch.device("cpu")
    launchers = {"static": short_conv.short_conv_triton, "headwise": triton_headwise.headwise_triton,
                 "lowrank": triton_lowrank.lowrank_triton}
    dy = torch.randn(B, T, D).to(torch.bfloat16)
    cases = []
    for cu, label in ((None, "no documents"), (_doc_layout(B, T, n_docs, cpu), f"{n_docs} documents")):
        for k in _kernels(B, T, D, W, torch.bfloat16, cpu):
            op, inputs = launchers[k.kind], list(k.inputs.values())
            fwd, bwd = _shortconv_settings(k.kind, k.inputs, overrides)
            cases.append((f"{k.name}, {label}", lambda op=op, inputs=inputs, cu=cu, fwd=fwd, bwd=bwd: (
                op.fwd(*inputs, cu, True, **fwd), op.bwd(dy, *inputs, cu, True, **bwd))))
    return cases


def attention_cases(overrides: dict) -> list[tuple[str, Callable]]:
    fwd, bwd = (setting(overrides, attn, attn.config_for(backward)) for backward in (False, True))
    cases = []
    for T in (127, 1023):
        def call(T=T):
            q, k, v, do = (torch.randn(18 * 128, T, 16, 8).to(torch.bfloat16).transpose(1, 2) for _ in range(4))
            o, lse = torch.empty_like(q), torch.empty(q.shape[:-1])
            attn._attention_fwd(q, k, v, 8**-0.5, config=fwd)
            attn._attention_bwd(do, q, k, v, o, lse, 8**-0.5, config=bwd)
        cases.append((f"attention T={T}", call))
    return cases


def rubiconv_cases(overrides: dict, n_tokens: int = 65536, d: int = 1024) -> list[tuple[str, Callable]]:
    """The benchmark's row at its automatic block (k=128), at k=64, which timed faster on the H200, at k=256,
    the automatic block of documents past 8,192 tokens, and at k=512 (the GPU verify's largest block: its shared
    memory must fit the SM's 227 KB)."""
    cu = lognormal_layout(n_tokens, 0, torch.device("cpu"))
    cases = []
    for block, precision, dtype in [(b, p, t) for b in (None, 64, 256, 512) for p, t in (("fp32", torch.float32),
                                                                              ("bf16", torch.bfloat16))]:
        plan = gemm.get_plan(cu, 1, n_tokens, n_tokens, block, torch.device("cpu"))

        configs = {stage: setting(overrides, rubi, rubi.config_for(stage, plan.k))
                   for stage in ("block_fwd", "spectrum", "block_inv")}

        def call(plan=plan, precision=precision, dtype=dtype, configs=configs):
            x, h = torch.randn(1, n_tokens, d).to(dtype), torch.randn(d, n_tokens).to(dtype)
            t = rubi._tables(plan, precision)
            _, sx, hs = rubi._forward(x, h, plan, t, save_spectra=True, configs=configs)
            rubi._backward(x, sx, hs, h, plan, t, need_dx=True, configs=configs)
        cases.append((f"rubiconv {precision}, k={plan.k}", call))
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="shortconv,attention,rubiconv",
                        help="comma-separated: shortconv, attention, rubiconv")
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200)")
    parser.add_argument("--config", action="append", default=[], metavar="MODULE[KEY].FIELD=VALUE",
                        help="a field of a table row to compile with (a Python literal), e.g. "
                             f"'headwise[fwd,tiled,hs1].tile=1024'; modules: {', '.join(MODULES)}")
    parser.add_argument("--calls", default="", metavar="TEXT",
                        help="only the calls whose label contains TEXT, e.g. 'low-rank' or 'head size 16, no'")
    args = parser.parse_args()
    try:
        overrides = parse_configs(args.config)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    groups = {"shortconv": shortconv_cases, "attention": attention_cases, "rubiconv": rubiconv_cases}
    unknown = sorted(set(args.ops.split(",")) - set(groups))
    if unknown:
        print(f"unknown op group {unknown[0]!r}; choose from {', '.join(groups)}", file=sys.stderr)
        return 2
    target = GPUTarget("cuda", args.arch, 32)
    print(f"# Triton {triton.__version__}, sm_{args.arch}a, torch {torch.__version__}")
    print("| call | kernel | warps | registers | spilled bytes | shared bytes | layout moves | in loops: shuffles / "
          "barriers | loads in loops | blocks an SM by registers |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for group in args.ops.split(","):
        for label, call in groups[group](overrides):
            if args.calls not in label:
                continue
            reports: list[dict] = []
            with intercepted(target, reports):
                call()
            for r in reports:
                blocks = min(MAX_WARPS // r["warps"], MAX_REGS // (r["registers"] * 32 * r["warps"]))
                print(f"| {label} | {r['name']} | {r['warps']} | {r['registers']} | {r['spill']} | {r['shared']} "
                      f"| {r['moves']} | {r['loop_shuffles']} / {r['loop_barriers']} | {r['loop_loads']} "
                      f"| {blocks} ({100 * blocks * r['warps'] / MAX_WARPS:.1f}% occupancy) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
