"""Test workload: grow memory inside a sub-interpreter (``_xxsubinterpreters.run_string``), then in the main one.

``run_in_subinterpreter`` creates a sub-interpreter and runs :data:`CODE` in
it: the sub-interpreter's function ``grow_in_sub`` appends ``--rows``
distinct 400-byte ``bytes`` objects to a list it keeps. Then the main
interpreter's ``grow_in_main`` does the same. Growth inside the
sub-interpreter belongs to ``grow_in_sub``, not to ``run_in_subinterpreter``
(the main-interpreter frame that called ``run_string``).

CPython 3.9-3.12 name the module ``_xxsubinterpreters``, 3.13 ``_interpreters``.

Output (JSON lines, see ``workload_common.py``): ``{"event": "ready", ...}``,
then ``{"event": "grown", "pid": ..., "rows": ...}``, then ``--hold`` seconds of
sleep before exit.

Run::

    python subinterpreter_grow.py --rows 200000
"""

from __future__ import annotations

import argparse
import sys
import time

from workload_common import emit

try:
    import _xxsubinterpreters as interpreters
except ImportError:
    import _interpreters as interpreters

#: Run in the sub-interpreter; ``ROWS`` is replaced by ``--rows``.
CODE = """
def grow_in_sub():
    rows = []
    for i in range(ROWS):
        rows.append(b"%0400d" % i)
    return rows
keep = grow_in_sub()
"""

#: What the main interpreter grew, kept until exit.
_KEEP: list[bytes] = []


def run_in_subinterpreter(rows: int) -> object:
    """Create a sub-interpreter and grow ``rows`` rows in it; return it (kept alive)."""
    interp = interpreters.create()
    interpreters.run_string(interp, CODE.replace("ROWS", str(rows)))
    return interp


def grow_in_main(rows: int) -> None:
    """Grow ``rows`` rows in the main interpreter."""
    for i in range(rows):
        _KEEP.append(b"%0400d" % i)


def main() -> int:
    """Grow in a sub-interpreter, then in the main one; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200000, help="rows per interpreter (default 200000)")
    parser.add_argument("--hold", type=float, default=1.0,
                        help="seconds to live after growing, so a tracer reads the code objects (default 1)")
    args = parser.parse_args()
    emit("ready")
    interp = run_in_subinterpreter(args.rows)
    grow_in_main(args.rows)
    emit("grown", rows=args.rows, interpreter=str(interp))
    time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
