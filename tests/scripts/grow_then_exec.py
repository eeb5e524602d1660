"""Test workload: grow ~``--mib`` MiB in ``grow_before_exec``, then replace the process with ``/bin/sleep`` (execv).

:func:`grow_before_exec` appends distinct 432-byte ``bytes`` objects to the
module-level list ``_KEPT`` until ``--mib`` MiB (``sys.getsizeof`` of the
objects plus their 8-byte list slots) are held. The script reports, then
calls ``os.execv("/bin/sleep", ["sleep", <--sleep-seconds>])`` while still
holding them: the exec discards the whole Python address space at once
(nothing is freed by the interpreter), and the same pid goes on as
``sleep``, whose memory is small, for ``--sleep-seconds``, then exits 0.

Output (JSON lines, see ``workload_common.py``; ``status*`` are
:func:`workload_common.proc_status` dicts, in bytes):
``{"event": "before_exec", "pid": ..., "function": "grow_before_exec", "held_bytes": ...,
"objects": ..., "status_start": {...}, "status": {...}, "growth_bytes": <RssAnon now - at start>,
"exec": ["/bin/sleep", "sleep", "<seconds>"]}`` right before the exec (``sleep`` prints nothing).

With ``--exec-python PATH`` it execs another interpreter instead:
``PATH grow_cache.py --mib <--then-mib> --hold <--sleep-seconds> --start-delay <--start-delay>`` (the
same pid goes on as another CPython version, which grows in
``fill_cache``).

Run::

    python grow_then_exec.py --mib 60 --sleep-seconds 1 --start-delay 1

``--start-delay`` seconds pass before the growth: a tracer that starts the
script (``memtrace run``) finds the interpreter some time after the exec.
"""

from __future__ import annotations

import argparse
import os
import sys

from workload_common import MIB, emit, proc_status, wait_for_start

#: Payload bytes of each object: with the 33-byte ``bytes`` header, 432 bytes,
#: a multiple of pymalloc's 16-byte size classes (no rounding slack).
OBJECT_PAYLOAD_BYTES = 399

#: Bytes of one list slot (a pointer), counted with each object.
SLOT_BYTES = 8

#: The program the script execs into.
SLEEP = "/bin/sleep"

#: The kept memory: filled by :func:`grow_before_exec`, discarded by the exec.
_KEPT: list[bytes] = []


def grow_before_exec(target_bytes: int) -> tuple[int, int]:
    """Append distinct bytes objects to ``_KEPT`` until ``target_bytes`` are held; return ``(objects, bytes held)``.

    Counted per object: ``sys.getsizeof`` (432) plus its list slot (8).
    """
    held = 0
    count = 0
    while held < target_bytes:
        item = ((b"%08d" % count) * 50)[:OBJECT_PAYLOAD_BYTES]
        _KEPT.append(item)
        held += sys.getsizeof(item) + SLOT_BYTES
        count += 1
    return count, held


def main(argv: list[str] | None = None) -> int:
    """Grow, report, exec ``sleep``; returns only if the exec fails (exit 1)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=60.0, help="MiB to allocate and keep (default 60)")
    parser.add_argument("--sleep-seconds", type=float, default=1.0,
                        help="seconds the exec'd /bin/sleep sleeps (default 1)")
    parser.add_argument("--exec-python", help="exec this interpreter running grow_cache.py instead of sleep")
    parser.add_argument("--then-mib", type=float, default=60.0,
                        help="with --exec-python: MiB grow_cache.py grows (default 60)")
    parser.add_argument("--start-delay", type=float, default=0.0,
                        help="seconds to wait before growing (default 0)")
    args = parser.parse_args(argv)
    wait_for_start(args.start_delay)
    start = proc_status()
    objects, held = grow_before_exec(int(args.mib * MIB))
    now = proc_status()
    seconds = f"{max(0.0, args.sleep_seconds):g}"
    if args.exec_python:
        grow_cache = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grow_cache.py")
        argv_next = [args.exec_python, grow_cache, "--mib", f"{args.then_mib:g}", "--hold", seconds,
                     "--start-delay", f"{args.start_delay:g}"]
    else:
        argv_next = ["sleep", seconds]
    program = argv_next[0] if args.exec_python else SLEEP
    emit("before_exec", function="grow_before_exec", held_bytes=held, objects=objects, status_start=start,
         status=now, growth_bytes=now["RssAnon"] - start["RssAnon"], exec=[program, *argv_next])
    os.execv(program, argv_next)
    return 1  # not reached: execv returns only by raising OSError


if __name__ == "__main__":
    sys.exit(main())
