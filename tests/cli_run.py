"""Run a command-line entry point inside the test process, for its argument errors.

Why not a subprocess: argument errors are raised before the tool does any work, and starting
Python with JAX and TE costs about two seconds of CPU each time; the tools' real processes are
run, as typed, by tests/site/test_shown_commands.py and by each tool's own end-to-end tests.
"""

from collections.abc import Callable, Sequence


def exit_status_and_stderr(main: Callable, argv: Sequence[str], capsys) -> tuple[object, str]:
    """``main(argv)``'s exit status (``SystemExit``'s code, else its return value) and its
    stderr."""
    capsys.readouterr()
    try:
        status = main(list(argv))
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err
