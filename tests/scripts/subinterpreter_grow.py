"""Test workload: grow memory inside a sub-interpreter (``_xxsubinterpreters.run_string``), then in the main one.

``run_in_subinterpreter`` creates a sub-interpreter and runs :data:`CODE` in
it: the sub-interpreter's function ``grow_in_sub`` appends ``--rows``
distinct 400-byte ``bytes`` objects to a list it keeps. Then the main
interpreter's ``grow_in_main`` does the same. Growth inside the
sub-interpreter belongs to ``grow_in_sub``, not to ``run_in_subinterpreter``
(the main-interpreter frame that called ``run_string``).

CPython 3.9-3.12 name the module ``_xxsubinterpreters``, 3.13 ``_interpreters``;
from 3.14 the public ``concurrent.interpreters`` is used (``Interpreter.exec``).
With ``--in-thread`` the sub-interpreter runs in a thread of its own
(``threading.Thread`` calling ``run_in_subinterpreter``), as
``concurrent.interpreters`` pools do.

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

import threading

try:
    from concurrent import interpreters
except ImportError:
    interpreters = None
    try:
        import _xxsubinterpreters as lowlevel
    except ImportError:
        import _interpreters as lowlevel

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
    code = CODE.replace("ROWS", str(rows))
    if interpreters is not None:
        interp = interpreters.create()
        interp.exec(code)
        return interp
    interp = lowlevel.create()
    lowlevel.run_string(interp, code)
    return interp


def destroy(interp: object) -> None:
    """Destroy a sub-interpreter (3.11 hangs at exit on one another thread created and left)."""
    if interpreters is not None:
        interp.close()
    else:
        lowlevel.destroy(interp)


def run_in_thread(rows: int, done: threading.Event) -> tuple[object, threading.Thread]:
    """Run :func:`run_in_subinterpreter` in a thread of its own, which destroys it once ``done`` is set.

    Returns once the sub-interpreter grew: the interpreter and the thread.
    """
    ran = threading.Event()
    result = []

    def thread_main() -> None:
        result.append(run_in_subinterpreter(rows))
        ran.set()
        done.wait()
        destroy(result[0])

    thread = threading.Thread(target=thread_main, name="sub")
    thread.start()
    ran.wait()
    return result[0], thread


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
    parser.add_argument("--in-thread", action="store_true",
                        help="run the sub-interpreter in a thread of its own")
    args = parser.parse_args()
    emit("ready")
    done = threading.Event()
    if args.in_thread:
        interp, thread = run_in_thread(args.rows, done)
    else:
        interp, thread = run_in_subinterpreter(args.rows), None
    grow_in_main(args.rows)
    emit("grown", rows=args.rows, interpreter=str(interp))
    time.sleep(args.hold)
    if thread is not None:
        done.set()
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
