"""What the Python benchmarks check before they start: their arguments and the programs they
run, each problem as one usage line (argparse's error, exit 2), not a traceback half way."""

import os
import shlex
import shutil


def check_tools(parser, braid, mpiexec=None, at_least_one=()):
    """`braid` must be an executable, `mpiexec` (a command line, when given) must start with a
    program on PATH, and every (flag, value) of `at_least_one` must be >= 1."""
    for flag, value in at_least_one:
        if value < 1:
            parser.error(f"{flag} must be at least 1, not {value}")
    if not (os.path.isfile(braid) and os.access(braid, os.X_OK)):
        parser.error(f"--braid {braid}: no such executable")
    if mpiexec is not None:
        launcher = shlex.split(mpiexec)
        if not launcher or not shutil.which(launcher[0]):
            parser.error(f"--mpiexec {mpiexec!r}: {launcher[0] if launcher else 'nothing'} is not on PATH")
