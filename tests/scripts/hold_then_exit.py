"""Test workload: allocate ~``--mib`` MiB in ``hold_memory``, hold it, then exit the way ``--exit-mode`` says.

:func:`hold_memory` appends distinct 432-byte ``bytes`` objects to the
module-level list ``_HELD`` until ``--mib`` MiB (``sys.getsizeof`` of the
objects plus their 8-byte list slots) are held. The script then holds them
for ``--hold-seconds`` and exits, still holding them, by ``--exit-mode``:

* ``normal``: returns from ``main`` (exit code 0); the interpreter's
  finalization clears the module globals and so frees the objects
  (pymalloc returns its emptied arenas with ``munmap``) before the process exits;
* ``sys_exit``: ``sys.exit(3)`` (exit code 3), finalization as for ``normal``;
* ``thread``: ``main`` starts a non-daemon thread that does all of the above
  and returns at once (exit code 0): the interpreter enters ``Py_FinalizeEx``
  before anything is allocated, waits there for the thread, and frees the
  objects only after it ended;
* ``os_exit``: ``os._exit(4)`` (exit code 4): no finalization, nothing freed
  before the kernel tears the address space down;
* ``sigkill``: ``os.kill(os.getpid(), SIGKILL)`` (killed by signal 9, wait
  status 9, exit code -9 in Python's ``subprocess`` terms): no finalization.

Output (JSON lines, see ``workload_common.py``; ``status*`` are
:func:`workload_common.proc_status` dicts, in bytes):

* ``{"event": "holding", "pid": ..., "function": "hold_memory", "held_bytes": ..., "objects": ...,
  "status_start": {...}, "status": {...}, "growth_bytes": <RssAnon now - at start>}`` after allocating;
* ``{"event": "exiting", "pid": ..., "exit_mode": ..., "expected_exit_code": 0 | 3 | 4 | -9,
  "status_start": {...}, "status": {...}, "rss_growth_bytes": <VmRSS now - at start>,
  "growth_bytes": <RssAnon now - at start>}`` right before exiting.

Run::

    python hold_then_exit.py --mib 200 --hold-seconds 2 --exit-mode normal --start-delay 2

``--start-delay`` seconds pass before the allocation (in the holding thread
in ``thread`` mode, so ``main`` still returns at once): a tracer that starts
the script (``memtrace run``) finds the interpreter, and attaches at its exit
point, some time after the exec.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from workload_common import MIB, emit, proc_status, wait_for_start

#: Payload bytes of each object: with the 33-byte ``bytes`` header, 432 bytes,
#: a multiple of pymalloc's 16-byte size classes (no rounding slack).
OBJECT_PAYLOAD_BYTES = 399

#: Bytes of one list slot (a pointer), counted with each object.
SLOT_BYTES = 8

#: Exit code (``subprocess`` convention: minus the signal number when killed) of each exit mode.
EXIT_CODES = {"normal": 0, "sys_exit": 3, "os_exit": 4, "sigkill": -signal.SIGKILL, "thread": 0}

#: The held memory: filled by :func:`hold_memory`, never emptied (freed only by finalization).
_HELD: list[bytes] = []


def hold_memory(target_bytes: int) -> tuple[int, int]:
    """Append distinct bytes objects to ``_HELD`` until ``target_bytes`` are held; return ``(objects, bytes held)``.

    Counted per object: ``sys.getsizeof`` (432) plus its list slot (8).
    """
    held = 0
    count = 0
    while held < target_bytes:
        item = ((b"%08d" % count) * 50)[:OBJECT_PAYLOAD_BYTES]
        _HELD.append(item)
        held += sys.getsizeof(item) + SLOT_BYTES
        count += 1
    return count, held


def main(argv: list[str] | None = None) -> int:
    """Allocate, hold, report, exit by ``--exit-mode``; return 0 only in ``normal`` mode."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=200.0, help="MiB to allocate and hold (default 200)")
    parser.add_argument("--hold-seconds", type=float, default=2.0,
                        help="seconds to hold the memory before exiting (default 2)")
    parser.add_argument("--exit-mode", choices=sorted(EXIT_CODES), default="normal",
                        help="normal: return from main (exit 0); sys_exit: sys.exit(3); os_exit: os._exit(4); "
                             "sigkill: SIGKILL to itself; thread: all of it in a non-daemon thread while main "
                             "returns (exit 0) (default normal)")
    parser.add_argument("--start-delay", type=float, default=0.0,
                        help="seconds to wait before allocating (default 0)")
    args = parser.parse_args(argv)
    if args.exit_mode == "thread":
        threading.Thread(target=hold_and_report, args=(args,), name="holder").start()
        return 0
    hold_and_report(args)
    if args.exit_mode == "sys_exit":
        sys.exit(3)
    if args.exit_mode == "os_exit":
        os._exit(4)
    if args.exit_mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)  # not reached: SIGKILL cannot be caught
    return 0


def hold_and_report(args: argparse.Namespace) -> None:
    """Wait ``--start-delay``, allocate and hold ``--mib`` MiB, report ``holding``, hold, report ``exiting``."""
    wait_for_start(args.start_delay)
    start = proc_status()
    objects, held = hold_memory(int(args.mib * MIB))
    now = proc_status()
    emit("holding", function="hold_memory", held_bytes=held, objects=objects, status_start=start, status=now,
         growth_bytes=now["RssAnon"] - start["RssAnon"])
    time.sleep(max(0.0, args.hold_seconds))
    now = proc_status()
    emit("exiting", exit_mode=args.exit_mode, expected_exit_code=EXIT_CODES[args.exit_mode], status_start=start,
         status=now, rss_growth_bytes=now["VmRSS"] - start["VmRSS"], growth_bytes=now["RssAnon"] - start["RssAnon"])


if __name__ == "__main__":
    sys.exit(main())
