"""``--smoke``, shared by every benchmark (a helper, not a benchmark: tests/test_benchmarks_smoke.py
runs every other ``benchmarks/*.py`` with ``--smoke``).

A smoke run takes the benchmark's whole code path with tiny settings, in seconds, and ends with the
same JSON line (the same keys) as a full run; its numbers measure nothing. Its run folders go to a
temporary folder, removed when it exits, never over the run folders of the documented figures.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import shutil
import tempfile

HELP = (
    "tiny settings: the whole code path in seconds and the same final JSON line, run folders in a "
    "temporary folder (a check that the benchmark runs, not a figure)"
)


@functools.cache
def scratch() -> str:
    """The smoke run's temporary folder for run folders (made on first use, removed at exit)."""
    path = tempfile.mkdtemp(prefix="mmrl_smoke_")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None, **tiny) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with a ``--smoke`` flag that makes ``tiny`` the defaults of those
    arguments (what the command line gives explicitly still wins). A callable value is called only
    under ``--smoke`` (``out=scratch``: the temporary folder is made only then)."""
    parser.add_argument("--smoke", action="store_true", help=HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**{k: v() if callable(v) else v for k, v in tiny.items()})
        args = parser.parse_args(argv)
    return args
