"""Test workload: grow ``--mib`` MiB in each kind of Python frame a stack walker must name.

Phases, in order, each appending distinct 400-byte ``bytes`` objects to a
list kept until exit:

* ``generator``: the generator ``produce_rows`` yields the rows and
  ``consume_generator`` collects them: the growth happens in the
  generator's frame (its ``b"%0400d" % i``);
* ``coroutine``: ``asyncio.run(fetch_rows(...))``: the async function
  ``fetch_rows`` grows between ``await asyncio.sleep(0)`` calls;
* ``init``: ``Cache(...)``: the growth is in ``Cache.__init__``, called
  through the interpreter's ``__init__`` shim frame on 3.13+ (which is not
  Python code and must not show);
* ``method``: ``Outer.Inner.grow``, a method of a nested class, named by
  its qualified name (3.11+).

Output (JSON lines, see ``workload_common.py``): ``{"event": "ready", "pid": ...,
"jit": <whether the JIT is on: ``sys._jit.is_enabled()`` on 3.14+, else false>}``,
then, after ``--start-delay`` seconds, one ``{"event": "phase", "pid": ..., "phase": ..., "function": <qualified
name of the growing function>, "rss_growth_bytes": ...}`` per phase, then
``--hold`` seconds of sleep before exit.

Run::

    python frames_grow.py --mib 40
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from workload_common import MIB, emit, rss_bytes, wait_for_start

#: Bytes each row adds (``sys.getsizeof`` of a 400-byte payload, plus its list slot).
ROW_BYTES = 433 + 8

#: Everything grown, kept until exit.
_KEEP: list[object] = []


def produce_rows(rows: int):
    """Yield ``rows`` distinct 400-byte rows (the growth is in this generator's frame)."""
    for i in range(rows):
        yield b"%0400d" % i


def consume_generator(rows: int) -> None:
    """Keep what :func:`produce_rows` yields."""
    _KEEP.append(list(produce_rows(rows)))


async def fetch_rows(rows: int) -> list[bytes]:
    """Build ``rows`` rows in an async function, yielding to the event loop every 1000."""
    out = []
    for i in range(rows):
        out.append(b"%0400d" % i)
        if i % 1000 == 0:
            await asyncio.sleep(0)
    return out


class Cache:
    """A cache filled in its ``__init__``."""

    def __init__(self, rows: int) -> None:
        self.rows = [b"%0400d" % i for i in range(rows)]


class Outer:
    """Holds a nested class, for qualified names."""

    class Inner:
        """Its method grows."""

        @staticmethod
        def grow(rows: int) -> list[bytes]:
            """Build ``rows`` rows."""
            out = []
            for i in range(rows):
                out.append(b"%0400d" % i)
            return out


def main() -> int:
    """Run each phase, report it, hold, exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=40.0, help="MiB per phase (default 40)")
    parser.add_argument("--hold", type=float, default=1.0,
                        help="seconds to live after growing, so a tracer reads the code objects (default 1)")
    parser.add_argument("--start-delay", type=float, default=0.0,
                        help="seconds to wait after ready before the first phase, so a tracer "
                             "started with the process has found its interpreter (default 0)")
    args = parser.parse_args()
    rows = int(args.mib * MIB / ROW_BYTES)
    jit = getattr(sys, "_jit", None)
    emit("ready", jit=bool(jit and jit.is_enabled()))
    wait_for_start(args.start_delay)
    phases = [
        ("generator", "produce_rows", lambda: consume_generator(rows)),
        ("coroutine", "fetch_rows", lambda: _KEEP.append(asyncio.run(fetch_rows(rows)))),
        ("init", "Cache.__init__", lambda: _KEEP.append(Cache(rows))),
        ("method", "Outer.Inner.grow", lambda: _KEEP.append(Outer.Inner.grow(rows))),
    ]
    for phase, function, run in phases:
        before = rss_bytes()
        run()
        emit("phase", phase=phase, function=function, rss_growth_bytes=rss_bytes() - before)
    time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
