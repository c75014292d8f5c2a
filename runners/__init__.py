"""Running things, in rooms by job: ``train`` (what defines a run, the one-run loop, the stacked engine and what
both share), ``sweep`` (grids and the MAD protocol planned as runs, grouped into jobs, run by a backend into a
folder), ``bench`` (kernel and training benchmarks), ``check`` (the mixer and task contract audits) and ``cli`` (the
``mixlab`` command line). Imports point one way: train uses no other room, sweep uses train, bench uses both,
check uses train and bench's timing, and the cli uses them all."""
