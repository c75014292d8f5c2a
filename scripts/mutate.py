"""Mutation check of the test suite: one-line bugs put into a scratch copy of the repository, and whether the
tests written against each one fail.

    python scripts/mutate.py                               # every mutant: a markdown table on stdout
    python scripts/mutate.py --only attention-rope-off-keys --only early-stop-without-threshold
    python scripts/mutate.py --out docs/mutation.md        # also write the table there, with date and command

A mutant is one row of MUTANTS: a file, a text that occurs on exactly one of its lines, what replaces it there,
and the test files (or node ids) that must fail with it. The scratch copy (under the system's temp folder) holds
every tracked and untracked, not ignored file of the working tree, with ``mixlab.<folder>`` importing from the
copy. First the union of all listed tests runs on the unmutated copy (it must pass, else a "kill" means
nothing); then each mutant edits its file in the copy, runs ``pytest -x`` on its tests with bytecode caching
off, and restores the file. Result: killed (a test failed), SURVIVED (all passed), or error (the text is not on
exactly one line: the row is stale; or pytest could not collect). Exit status 1 unless every mutant is killed.

Not part of CI (a few minutes per mutant on 2 cores); the last run's table is docs/mutation.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the test files, and single tests of the slow ones, that the mutants name
ENGINE = "tests/runners/test_engine.py"
TRAIN = "tests/runners/test_train.py"
REFERENCES = "tests/models/test_mixer_references.py"
FLA = "tests/models/test_fla.py"
SCHEDULE = "tests/runners/test_schedule.py"
EARLY_STOP = (f"{ENGINE}::test_early_stop_needs_macro_accuracy_strictly_above_the_threshold_in_both_loops",
              f"{TRAIN}::test_early_stop_at_accuracy_threshold")
TORCHMETRICS = f"{TRAIN}::test_macro_accuracy_follows_torchmetrics_defaults"
MACRO_PER_BATCH = f"{TRAIN}::test_macro_accuracy_and_perplexity_match_torchmetrics_per_batch_as_mad_lab_logs_them"
ONE_RUN_EQUALS_STACK = f"{ENGINE}::test_batched_records_equal_one_at_a_time"
ADAMW_UPDATE = f"{ENGINE}::test_adamw_update_matches_torch_adamw"


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    original: str  # occurs on exactly one line of the file
    replacement: str
    tests: tuple[str, ...]  # test files or node ids, relative to the repository root


MUTANTS = [
    # --- the early stop (both loops decide it in runners/train/record.py) ---
    Mutant("early-stop-without-threshold", "runners/train/record.py",
           'stop is not None and entry["acc_macro"] > stop', "stop is not None", EARLY_STOP),
    Mutant("early-stop-on-micro-accuracy", "runners/train/record.py",
           'entry["acc_macro"] > stop', 'entry["acc_micro"] > stop', EARLY_STOP),
    Mutant("early-stop-at-the-threshold", "runners/train/record.py",
           'entry["acc_macro"] > stop', 'entry["acc_macro"] >= stop', EARLY_STOP),
    # --- metrics ---
    Mutant("micro-accuracy-reported-as-macro", "runners/train/metrics.py",
           '"acc_macro": float(np.average([row[3] for row in rows] or [0.0], weights=weights))',
           '"acc_macro": correct / max(n, 1.0)', (MACRO_PER_BATCH,)),
    Mutant("macro-batches-unweighted", "runners/train/metrics.py",
           "np.average([row[3] for row in rows] or [0.0], weights=weights)",
           "np.average([row[3] for row in rows] or [0.0])", (MACRO_PER_BATCH,)),
    Mutant("macro-skips-predicted-only-classes", "runners/train/metrics.py",
           "seen = (tp + fp + fn) > 0", "seen = (tp + fn) > 0", (TORCHMETRICS,)),
    Mutant("false-positive-counted-on-the-target", "runners/train/metrics.py",
           '"fp": zeros.scatter_add(0, pred, miss)', '"fp": zeros.scatter_add(0, safe_target, miss)',
           (TORCHMETRICS,)),
    # --- learning-rate schedule ---
    Mutant("warmup-starts-at-zero", "runners/train/schedule.py",
           "train.lr * (step + 1) / train.warmup_steps", "train.lr * step / train.warmup_steps", (SCHEDULE,)),
    Mutant("cosine-step-counts-the-warmup", "runners/train/schedule.py",
           "progress = (step - train.warmup_steps) / max(total_steps - train.warmup_steps, 1)",
           "progress = step / max(total_steps, 1)", (SCHEDULE,)),
    Mutant("cosine-epoch-one-epoch-ahead", "runners/train/schedule.py",
           "progress = epoch / max(total_epochs, 1)", "progress = (epoch + 1) / max(total_epochs, 1)",
           (SCHEDULE,)),
    # --- optimizer: the one-run loop's AdamW, the engine's own update ---
    Mutant("adamw-beta2-is-beta1", "runners/train/run.py",
           "betas=(tc.beta1, tc.beta2)", "betas=(tc.beta1, tc.beta1)", (ONE_RUN_EQUALS_STACK,)),
    Mutant("adamw-without-weight-decay", "runners/train/run.py",
           "weight_decay=tc.weight_decay)", "weight_decay=0.0)", (ONE_RUN_EQUALS_STACK,)),
    Mutant("engine-decay-at-peak-lr", "runners/train/engine.py",
           "decay.append([1 - lr * run.config.train.weight_decay",
           "decay.append([1 - run.config.train.lr * run.config.train.weight_decay", (ONE_RUN_EQUALS_STACK,)),
    Mutant("engine-bias-correction-one-step-late", "runners/train/engine.py",
           "t = float(s + 1)", "t = float(s + 2)", (ONE_RUN_EQUALS_STACK,)),
    Mutant("engine-second-moment-with-beta1", "runners/train/engine.py",
           "addcmul_(grads, grads, value=1 - beta2)", "addcmul_(grads, grads, value=1 - beta1)",
           (ADAMW_UPDATE,)),
    # --- mixers ---
    Mutant("attention-rope-off-keys", "models/mixers/attention.py",
           "q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)", "q, k = apply_rope(q, cos, sin), k",
           (REFERENCES,)),
    Mutant("attention-not-causal", "models/mixers/attention.py",
           "F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)",
           "F.scaled_dot_product_attention(q, k, v, is_causal=False).transpose(1, 2)", (REFERENCES,)),
    Mutant("rope-turns-backwards", "models/layers.py",
           "rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)",
           "rotated = torch.cat([x32[..., half:], -x32[..., :half]], dim=-1)", (REFERENCES,)),
    Mutant("causal-mask-shifted-by-one", "kernels/attention/naive.py",
           ".triu(1)", ".triu(2)", ("tests/kernels/test_attention.py::test_reference_matches_torch_sdpa",)),
    Mutant("short-conv-tap-off-by-one", "kernels/short_conv/naive.py",
           "shift_in_doc(xc, k, pos) * w[k]", "shift_in_doc(xc, k, pos) * w[k - 1]",
           (REFERENCES, "tests/kernels/test_reference.py::test_short_conv_matches_loops")),
    Mutant("headwise-conv-weights-transposed", "models/mixers/short_conv.py",
           "w = self.to_w(x).view(B, T, self.n_heads, self.width)",
           "w = self.to_w(x).view(B, T, self.width, self.n_heads).transpose(2, 3)", (REFERENCES,)),
    Mutant("long-conv-filter-one-tap-late", "models/mixers/long_conv.py",
           "h[:, :u.shape[1]]", "h[:, 1:u.shape[1] + 1]", (REFERENCES,)),
    # --- the fla baselines (models/mixers/fla.py, their ops in fla_ops.py) ---
    Mutant("gla-without-forget-gate", "models/mixers/fla.py",
           "o = self.attend(q, k, v, cu_seqlens, g=gk)", "o = self.attend(q, k, v, cu_seqlens, g=torch.zeros_like(gk))",
           (REFERENCES,)),
    Mutant("gated-delta-net-beta-one", "models/mixers/fla.py",
           "g=g, beta=b.sigmoid())", "g=g, beta=torch.ones_like(b))", (REFERENCES,)),
    Mutant("retnet-rotary-off-keys", "models/mixers/fla.py",
           "q, k = self.rotate(q, cu_seqlens), self.rotate(k, cu_seqlens)", "q, k = self.rotate(q, cu_seqlens), k",
           (REFERENCES,)),
    Mutant("retention-decays-one-head-off", "models/mixers/fla_ops.py",
           "2.0 ** (-5.0 - torch.arange(n_heads,", "2.0 ** (-6.0 - torch.arange(n_heads,", (REFERENCES,)),
    Mutant("based-without-scale", "models/mixers/fla.py",
           "return self.out(self.attend(q, k, v, cu_seqlens).flatten(-2))",
           "return self.out(self.attend(q, k, v, cu_seqlens, scale=1.0).flatten(-2))", (REFERENCES,)),
    Mutant("mamba2-without-decay", "models/mixers/fla.py",
           "g = -self.a_log.float().exp() * step", "g = torch.zeros_like(step)", (REFERENCES,)),
    Mutant("fla-state-not-reset-per-document", "models/mixers/fla_ops.py",
           "return per_document(lambda *t: naive(op, *t, scale), cu_seqlens, q, k, v, g, beta)",
           "return naive(op, q, k, v, g, beta, scale)", (REFERENCES,)),
    Mutant("gdr-state-not-decayed-across-chunks", "models/mixers/fla_ops.py",
           "state = state * last[:, :, i, :, None].exp() + k_out[:, :, i].transpose(-1, -2) @ e",
           "state = state + k_out[:, :, i].transpose(-1, -2) @ e", (FLA,)),
    Mutant("gdr-writes-blind-to-the-chunk", "models/mixers/fla_ops.py",
           "A = (k_beta @ k.transpose(-1, -2)) * L  # [B, H, n, C, C]",
           "A = torch.zeros_like(L)  # [B, H, n, C, C]", (FLA,)),
]


@dataclasses.dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    result: str  # killed, SURVIVED or error
    detail: str  # the first failing test, or why it is an error
    seconds: float


def scratch_copy(dest: Path) -> Path:
    """Copy the working tree's tracked and untracked, not ignored files to ``dest``; map ``mixlab.<folder>``
    onto the copy (``dest/.dev/mixlab/<folder>``, the package-dir mapping of pyproject.toml). Returns the
    folder to put on PYTHONPATH."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    mapping = re.findall(r'^"mixlab\.(\w+)" = "(\w+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    if not mapping:
        raise SystemExit("pyproject.toml has no [tool.setuptools.package-dir] entries for mixlab")
    namespace = dest / ".dev" / "mixlab"
    namespace.mkdir(parents=True)
    for package, folder in mapping:
        (namespace / package).symlink_to(dest / folder, target_is_directory=True)
    return dest / ".dev"


def pytest(tests: tuple[str, ...], copy: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=copy, env=env, capture_output=True, text=True)


def first_failure(output: str) -> str:
    found = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    return found.group(1).split("::", 1)[-1] if found else "(see pytest output)"


def apply(mutant: Mutant, text: str) -> str:
    """``text`` with the mutant's one line changed; ValueError unless the original is on exactly one line."""
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if mutant.original in line]
    if len(hits) != 1:
        raise ValueError(f"original text on {len(hits)} lines of {mutant.path}, expected 1")
    lines[hits[0]] = lines[hits[0]].replace(mutant.original, mutant.replacement, 1)
    return "".join(lines)


def run_mutant(mutant: Mutant, copy: Path, pythonpath: Path) -> Outcome:
    start = time.monotonic()
    target = copy / mutant.path
    original = target.read_text()
    try:
        target.write_text(apply(mutant, original))
    except ValueError as exc:
        return Outcome(mutant, "error", str(exc), 0.0)
    try:
        proc = pytest(mutant.tests, copy, pythonpath)
    finally:
        target.write_text(original)
    seconds = time.monotonic() - start
    if proc.returncode == 0:
        return Outcome(mutant, "SURVIVED", "every test passed", seconds)
    if proc.returncode == 1:
        return Outcome(mutant, "killed", first_failure(proc.stdout), seconds)
    return Outcome(mutant, "error", f"pytest exit status {proc.returncode}: {first_failure(proc.stdout)}", seconds)


def table(outcomes: list[Outcome]) -> str:
    rows = ["| mutant | file | change | tests run | result | first failure | s |", "|---|---|---|---|---|---|---|"]
    for o in outcomes:
        m = o.mutant
        change = f"`{m.original}` -> `{m.replacement}`".replace("|", "\\|")
        tests = ", ".join(t.split("/")[-1] for t in m.tests)
        rows.append(f"| {m.name} | {m.path} | {change} | {tests} | {o.result} | {o.detail} | {o.seconds:.0f} |")
    killed = sum(o.result == "killed" for o in outcomes)
    return "\n".join(rows) + f"\n\n{killed} of {len(outcomes)} mutants killed.\n"


PAGE = """# Mutation check

`scripts/mutate.py` puts one-line bugs into a scratch copy of the repository and runs, for each, the test files
written to catch it: a bug the suite must notice (an early stop that ignores its threshold, micro accuracy reported
as macro, attention without RoPE on the keys, a conv tap off by one, a shifted causal mask, optimizer and schedule
slips, an fla baseline without its decay or carrying its state into the next document). Every listed mutant must
be killed; a survivor needs a test. The mutants are rows of `MUTANTS` in the script; a row whose text no longer
occurs on exactly one line reports an error. Not part of CI: it runs the listed test files once per mutant.

Last run: {date}, `{command}`, {machine}.

{table}"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run this mutant (repeatable)")
    parser.add_argument("--out", type=Path, help="also write the table, with date and command, to this file")
    parser.add_argument("--machine", default=f"CPU {os.cpu_count()}-core", help="the machine, for --out")
    args = parser.parse_args(argv)
    names = {m.name for m in MUTANTS}
    unknown = set(args.only or ()) - names
    if unknown:
        parser.error(f"unknown mutant {sorted(unknown)[0]!r}; choose from {', '.join(sorted(names))}")
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    with tempfile.TemporaryDirectory(prefix="mixlab-mutate-") as folder:
        copy = Path(folder)
        pythonpath = scratch_copy(copy)
        union = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
        print(f"baseline: {len(union)} test files on the unmutated copy", file=sys.stderr)
        baseline = pytest(union, copy, pythonpath)
        if baseline.returncode != 0:
            print(baseline.stdout[-3000:], file=sys.stderr)
            print("the unmutated copy fails its tests: fix that first", file=sys.stderr)
            return 1
        outcomes = []
        for mutant in mutants:
            outcomes.append(run_mutant(mutant, copy, pythonpath))
            print(f"{mutant.name}: {outcomes[-1].result} ({outcomes[-1].detail})", file=sys.stderr)
    text = table(outcomes)
    print(text)
    if args.out:
        command = shlex.join(["python", "scripts/mutate.py", *(argv if argv is not None else sys.argv[1:])])
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        args.out.write_text(PAGE.format(date=date, command=command, machine=args.machine, table=text))
    return 0 if all(o.result == "killed" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
