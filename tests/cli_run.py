"""The ``mixlab`` command line called in-process by the tests, and the one-line error rule they hold it to."""

from mixlab.runners.cli.main import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``mixlab *argv`` in this process: (exit status, stdout, stderr)."""
    code = 0
    try:
        main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error_line(err: str) -> str:
    """The single line of a refused command's stderr, which must start with ``mixlab: error: ``."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mixlab: error: "), err
    return lines[0]
