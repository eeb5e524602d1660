"""Test workload for attaching to a process whose main thread has exited: it calls ``pthread_exit`` while a worker thread runs on and grows.

The main thread starts a worker thread, prints ``ready`` and calls libc's
``pthread_exit``: the process lives on (``/proc/PID/task/PID`` is a zombie,
``/proc/PID/maps`` is empty) in its worker. The worker idles until
``--trigger-file`` appears or ``--start-delay`` seconds pass, then appends
distinct ~433-byte ``bytes`` objects to ``_GROWN`` in :func:`grow_in_worker`
until ``--mib`` MiB (by ``sys.getsizeof`` sums) are retained, holds them
``--hold`` seconds and ends the process with ``os._exit(0)``.

Output (JSON lines, see ``workload_common.py``):

* ``{"event": "ready", "pid": ..., "trigger_file": ...}``;
* ``{"event": "started", "pid": ..., "by": "trigger"|"delay"}`` when the wait ends;
* ``{"event": "grown", "pid": ..., "function": "grow_in_worker", "getsizeof_bytes": ...}``;
* ``{"event": "exit", "pid": ...}``.

Run::

    python main_thread_exits.py --mib 64 --trigger-file /tmp/go --start-delay 30 --hold 1
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import threading
import time

from workload_common import MIB, emit, wait_for_start

#: Payload bytes of each object (a repeated 8-digit number, so objects differ).
OBJECT_PAYLOAD_BYTES = 400

#: Filled by :func:`grow_in_worker`, never emptied.
_GROWN: list[bytes] = []


def grow_in_worker(target_bytes: int) -> int:
    """Append distinct bytes objects to ``_GROWN`` until their ``sys.getsizeof`` sum reaches ``target_bytes``.

    Returns the ``sys.getsizeof`` sum of the added objects.
    """
    repeat = OBJECT_PAYLOAD_BYTES // 8
    added_bytes = 0
    count = 0
    while added_bytes < target_bytes:
        item = (b"%08d" % count) * repeat
        _GROWN.append(item)
        added_bytes += sys.getsizeof(item)
        count += 1
    return added_bytes


def worker(args: argparse.Namespace) -> None:
    """Wait for the trigger, grow, report, hold, end the whole process."""
    emit("started", by=wait_for_start(args.start_delay, args.trigger_file))
    grown_bytes = grow_in_worker(int(args.mib * MIB))
    emit("grown", function="grow_in_worker", getsizeof_bytes=grown_bytes)
    time.sleep(max(0.0, args.hold))
    emit("exit")
    os._exit(0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the workload's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=64.0, help="MiB to grow by (default 64)")
    parser.add_argument("--trigger-file", default=None, help="start growing as soon as this file exists")
    parser.add_argument("--start-delay", type=float, default=10.0,
                        help="start growing after this many seconds if not triggered earlier (default 10)")
    parser.add_argument("--hold", type=float, default=1.0, help="seconds to hold the memory before exiting (default 1)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Start the worker, then end the main thread alone."""
    args = parse_args(argv)
    threading.Thread(target=worker, args=(args,)).start()
    emit("ready", trigger_file=args.trigger_file)
    # CDLL calls release the GIL, so the worker runs on after this thread ends.
    ctypes.CDLL(None).pthread_exit(None)


if __name__ == "__main__":
    main()
