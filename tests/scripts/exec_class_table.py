"""Test workload: build classes from source with ``exec``, each class body growing a table.

``build_tables`` compiles :data:`SOURCE` with an empty file name and runs it
``--tables`` times; each run's class body ``GeneratedTable`` (line 1 of the
source, like the source's ``<module>``) appends ``--rows`` distinct 400-byte
``bytes`` objects to its ``rows`` list, kept until exit. The code objects of
every other run are freed before the next run compiles new ones at the same
addresses, so a tracer that identifies code objects by address and first line
alone names the class body ``<module>`` (or the reverse).

Output (JSON lines, see ``workload_common.py``):

* ``{"event": "ready", "pid": ...}`` at start;
* ``{"event": "built", "pid": ..., "function": "GeneratedTable", "tables": ..., "rss_growth_bytes": ...}``,
  then ``--hold`` seconds of sleep before exit.

Run::

    python exec_class_table.py --tables 10 --rows 30000 --hold 1
"""

from __future__ import annotations

import argparse
import sys
import time

from workload_common import emit, rss_bytes

#: The class statement run by ``exec``: its body is the growing frame.
SOURCE = """class GeneratedTable:
    rows = []
    for i in range(ROWS):
        rows.append(b"%0400d" % i)
"""

#: Namespaces of the classes built (and every other run's code), kept until exit.
_KEEP: list[tuple[dict, object]] = []


def build_tables(tables: int, rows: int) -> None:
    """Run :data:`SOURCE` ``tables`` times, each compiled anew with an empty file name.

    The code objects of every other run are kept, so a tracer that reads them
    late still finds them; the others are freed as soon as their run ends.
    """
    for number in range(tables):
        namespace = {"ROWS": rows}
        code = compile(SOURCE, "", "exec")
        exec(code, namespace)
        _KEEP.append((namespace, code if number % 2 == 0 else None))


def main() -> int:
    """Build the tables, report the growth, exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=10, help="classes to build (default 10)")
    parser.add_argument("--rows", type=int, default=30000, help="rows per class (default 30000)")
    parser.add_argument("--hold", type=float, default=1.0,
                        help="seconds to live after building, so a tracer reads the code objects still alive (default 1)")
    args = parser.parse_args()
    emit("ready")
    before = rss_bytes()
    build_tables(args.tables, args.rows)
    emit("built", function="GeneratedTable", tables=args.tables, rss_growth_bytes=rss_bytes() - before)
    time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
