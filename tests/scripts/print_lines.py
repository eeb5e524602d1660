"""Test workload for the live view on a terminal: print ``--lines`` numbered lines, one every ``--interval`` seconds.

Each line is ``target line N of TOTAL`` (N from 1), written to standard
output (with ``--tty``, to ``/dev/tty``, the controlling terminal, as
``getpass`` and progress bars do) and flushed at once, so that it reaches the terminal between the
live view's redraws. A terminal test then checks that every line is still
in the terminal's history when memtrace has finished.

Run::

    python print_lines.py --lines 30 --interval 0.25 [--tty]
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=30, help="lines to print")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between lines")
    parser.add_argument("--tty", action="store_true", help="write to /dev/tty instead of standard output")
    args = parser.parse_args()
    out = open("/dev/tty", "w") if args.tty else sys.stdout  # noqa: SIM115 (open for the whole run)
    for number in range(1, args.lines + 1):
        print(f"target line {number} of {args.lines}", file=out, flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    main()
