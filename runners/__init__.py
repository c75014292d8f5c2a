"""Running things: one training run (``train``), sweeps (``sweep``), the MAD protocol (``mad``), the batched
engine (``engine``), benchmarks (``bench_*``) and the ``mixlab`` command line (``cli`` and its ``cli_*`` parts)."""
