"""Test workload: a pre-fork master starts N workers 1 s apart; each loads ~``--mib`` MiB in ``load_dataset``.

The master prints ``ready``, waits for ``--trigger-file`` to exist (at most
``--start-delay`` seconds; no wait by default), then forks ``--workers`` workers one by one,
``--fork-gap`` seconds apart, and waits for them; it allocates nothing
significant after ``ready`` (its RSS stays flat). Each worker, right after
its fork, reads its ``/proc/self/status`` counters, then runs
:func:`load_dataset`, which appends distinct 432-byte ``bytes`` objects to
the module-level list ``_DATASET`` until ``--mib`` MiB (``sys.getsizeof`` of
the objects plus their 8-byte list slots) are held, reports its growth,
holds the data until ``--seconds`` after the *first* fork and exits 0 (a
normal exit through ``os._exit(0)``, as a pre-fork worker does). So worker
``i`` grows at about ``i * --fork-gap`` seconds and all workers exit at about
the same time. Stdlib only; everything is bounded.

Output (JSON lines, see ``workload_common.py``; ``*_status`` are
:func:`workload_common.proc_status` dicts, in bytes):

* master: ``{"event": "ready", "pid": ..., "master_status": {...}}`` at start;
  ``{"event": "forked", "pid": <master>, "workers": {"0": pid, ...}, "fork_gap_seconds": ...,
  "dataset_bytes": ..., "master_status": {...}}`` after the last fork;
  ``{"event": "exit", "pid": <master>, "worker_exit_codes": {"0": 0, ...}}`` at the end;
* each worker: ``{"event": "status_before", "pid": ..., "index": i, "status": {...},
  "seconds_after_first_fork": ...}`` right after its fork; ``{"event": "worker_loaded",
  "pid": ..., "index": i, "function": "load_dataset", "objects": ..., "dataset_bytes": ...,
  "status_before": {...}, "status_after": {...}, "growth_bytes": <RssAnon after - before>,
  "load_seconds": ..., "seconds_after_first_fork": ...}`` after loading.

Run::

    python prefork_staggered.py --workers 4 --fork-gap 1.0 --mib 100 --seconds 6
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from workload_common import MIB, emit, proc_status, wait_for_start

#: Payload bytes of each object: with the 33-byte ``bytes`` header, 432 bytes,
#: a multiple of pymalloc's 16-byte size classes (no rounding slack).
OBJECT_PAYLOAD_BYTES = 399

#: Bytes of one list slot (a pointer), counted with each object.
SLOT_BYTES = 8

#: The worker's dataset: filled by :func:`load_dataset`, held until the worker exits.
_DATASET: list[bytes] = []


def load_dataset(target_bytes: int) -> int:
    """Append distinct bytes objects to ``_DATASET`` until ``target_bytes`` are held; return the objects added.

    Counted per object: ``sys.getsizeof`` (432) plus its list slot (8).
    """
    held = 0
    count = 0
    while held < target_bytes:
        item = ((b"%08d" % count) * 50)[:OBJECT_PAYLOAD_BYTES]
        _DATASET.append(item)
        held += sys.getsizeof(item) + SLOT_BYTES
        count += 1
    return count


def run_worker(index: int, target_bytes: int, first_fork: float, deadline: float) -> None:
    """Body of worker ``index``: report, load the dataset, report the growth, hold until ``deadline``."""
    before = proc_status()
    emit("status_before", index=index, status=before,
         seconds_after_first_fork=round(time.monotonic() - first_fork, 3))
    started = time.monotonic()
    objects = load_dataset(target_bytes)
    load_seconds = time.monotonic() - started
    after = proc_status()
    emit("worker_loaded", index=index, function="load_dataset", objects=objects,
         dataset_bytes=target_bytes, status_before=before, status_after=after,
         growth_bytes=after["RssAnon"] - before["RssAnon"], load_seconds=round(load_seconds, 3),
         seconds_after_first_fork=round(time.monotonic() - first_fork, 3))
    time.sleep(max(0.0, deadline - time.monotonic()))


def fork_worker(index: int, target_bytes: int, first_fork: float, deadline: float) -> int:
    """Fork worker ``index``; the child runs :func:`run_worker` and exits without returning."""
    pid = os.fork()
    if pid == 0:
        exit_code = 1
        try:
            run_worker(index, target_bytes, first_fork, deadline)
            exit_code = 0
        except BaseException:  # noqa: BLE001 (the child must never return into the master's code)
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            os._exit(exit_code)
    return pid


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the workload's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="number of forked workers (default 4)")
    parser.add_argument("--fork-gap", type=float, default=1.0, help="seconds between two forks (default 1.0)")
    parser.add_argument("--mib", type=float, default=100.0, help="MiB each worker loads (default 100)")
    parser.add_argument("--seconds", type=float, default=6.0,
                        help="every worker exits this many seconds after the first fork (default 6)")
    parser.add_argument("--start-delay", type=float, default=0.0,
                        help="most seconds to wait for --trigger-file before forking (default 0)")
    parser.add_argument("--trigger-file", default=None, help="fork once this file exists (default: none)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.fork_gap < 0 or args.mib < 0:
        parser.error("need --workers >= 1, --fork-gap >= 0 and --mib >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Fork the workers one by one, wait for them; exit 0 when every worker exited 0."""
    args = parse_args(argv)
    target_bytes = int(args.mib * MIB)
    emit("ready", master_status=proc_status())
    wait_for_start(args.start_delay, args.trigger_file)
    first_fork = time.monotonic()
    deadline = first_fork + args.seconds
    workers: dict[int, int] = {}
    for index in range(args.workers):
        if index:
            time.sleep(args.fork_gap)
        workers[index] = fork_worker(index, target_bytes, first_fork, deadline)
    emit("forked", workers={str(i): pid for i, pid in workers.items()}, fork_gap_seconds=args.fork_gap,
         dataset_bytes=target_bytes, master_status=proc_status())
    exit_codes = {}
    for index, pid in workers.items():
        _pid, status = os.waitpid(pid, 0)
        exit_codes[str(index)] = os.waitstatus_to_exitcode(status)
    emit("exit", worker_exit_codes=exit_codes)
    return 0 if all(code == 0 for code in exit_codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
