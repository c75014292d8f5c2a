"""``mixlab bench ...``: kernel and training benchmarks (each prints a markdown table; GPU name and versions on top)."""

from __future__ import annotations

import typer

bench_app = typer.Typer(help="Benchmarks: kernels and training throughput (tables for BENCHMARKS.md).",
                        no_args_is_help=True)


def parse_shape(text: str, n: int, what: str) -> tuple[int, ...]:
    """``"4,4096,2048,4"`` -> (4, 4096, 2048, 4); anything else raises ValueError naming the text."""
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--shape expects {what}, got {text!r}") from None
    if len(shape) != n or min(shape) < 1:
        raise ValueError(f"--shape expects {what} (positive integers), got {text!r}")
    return shape


@bench_app.command("shortconv")
def bench_shortconv_cmd(
    shape: str = typer.Option("4,4096,2048,4", help="B,T,D,W."),
    dtype: str = typer.Option("bf16", help="fp32, bf16 or fp16."),
    n_docs: int = typer.Option(64, help="Documents in the packed variant."),
    repeats: int = typer.Option(100, help="Milliseconds of timed runs per measurement (do_bench rep)."),
) -> None:
    """Static, head-wise and low-rank short convs: fwd and fwd+bwd medians, bandwidth, byte floor, vs torch."""
    from runners.bench_shortconv import bench_shortconv

    typer.echo(bench_shortconv(parse_shape(shape, 4, "B,T,D,W"), dtype=dtype, n_docs=n_docs, repeats=repeats))


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
