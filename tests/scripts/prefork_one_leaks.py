"""Test workload: a master forks N workers and exactly one of them leaks in ``leak_in_worker``.

The master waits ``--start-delay`` seconds (so a tracer can attach to it
before the fork), forks ``--workers`` workers, prints which pid is which,
and waits for them. Worker ``--leaker`` waits ``--leak-after`` seconds, then
runs :func:`leak_in_worker`, which appends distinct ~417-byte ``bytes``
objects to the module-level list ``_LEAK`` until ``--mib`` MiB (by
``sys.getsizeof`` sums) are retained, spread evenly over ``--grow-seconds``
in 1 MiB steps. The other workers only sleep: their memory stays small and
flat. Every process exits by itself ``--seconds`` after the fork.

Output (JSON lines, see ``workload_common.py``):

* master: ``{"event": "ready", "pid": ...}`` at start;
  ``{"event": "forked", "pid": <master>, "workers": {"0": pid, ...}, "leaker_index": i,
  "leaker_pid": pid, "leak_bytes": ...}`` after the fork;
  ``{"event": "exit", "pid": <master>, "worker_exit_codes": {...}}`` at the end;
* each worker: ``{"event": "worker_done", "pid": ..., "index": i, "leaked_bytes": ...,
  "rss_before_bytes": ..., "rss_after_bytes": ..., "rss_growth_bytes": ...}`` before exiting.

Run::

    python prefork_one_leaks.py --workers 3 --leaker 1 --mib 128 --seconds 6
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from workload_common import MIB, emit, rss_bytes, wait_for_start

#: Payload bytes of each leaked object (a repeated 8-digit number, so objects differ).
OBJECT_PAYLOAD_BYTES = 384

#: Bytes added per pacing step of :func:`leak_in_worker`.
STEP_BYTES = MIB

#: The leak of the leaking worker: filled by :func:`leak_in_worker`, never emptied.
_LEAK: list[bytes] = []


def leak_in_worker(target_bytes: int, grow_seconds: float) -> int:
    """Append distinct bytes objects to ``_LEAK`` until their ``sys.getsizeof`` sum reaches ``target_bytes``.

    Paced in steps of :data:`STEP_BYTES` spread evenly over ``grow_seconds``
    (0: as fast as possible). Returns the ``sys.getsizeof`` sum added.
    """
    repeat = OBJECT_PAYLOAD_BYTES // 8
    steps = max(1, -(-target_bytes // STEP_BYTES))
    started = time.monotonic()
    added_bytes = 0
    count = 0
    for step in range(steps):
        step_target = min(target_bytes, (step + 1) * STEP_BYTES)
        while added_bytes < step_target:
            item = (b"%08d" % count) * repeat
            _LEAK.append(item)
            added_bytes += sys.getsizeof(item)
            count += 1
        time.sleep(max(0.0, started + grow_seconds * (step + 1) / steps - time.monotonic()))
    return added_bytes


def run_worker(index: int, args: argparse.Namespace, deadline: float) -> None:
    """Body of worker ``index``: leak if it is the leaker, then sleep until ``deadline``; report before returning."""
    rss_before = rss_bytes()
    leaked = 0
    if index == args.leaker:
        time.sleep(max(0.0, args.leak_after))
        leaked = leak_in_worker(int(args.mib * MIB), args.grow_seconds)
    time.sleep(max(0.0, deadline - time.monotonic()))
    rss_after = rss_bytes()
    emit("worker_done", index=index, leaked_bytes=leaked, rss_before_bytes=rss_before,
         rss_after_bytes=rss_after, rss_growth_bytes=rss_after - rss_before)


def fork_worker(index: int, args: argparse.Namespace, deadline: float) -> int:
    """Fork worker ``index``; the child runs :func:`run_worker` and exits without returning."""
    pid = os.fork()
    if pid == 0:
        exit_code = 1
        try:
            run_worker(index, args, deadline)
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
    parser.add_argument("--workers", type=int, default=3, help="number of forked workers (default 3)")
    parser.add_argument("--leaker", type=int, default=1, help="index of the leaking worker (default 1)")
    parser.add_argument("--mib", type=float, default=128.0, help="MiB the leaking worker retains (default 128)")
    parser.add_argument("--seconds", type=float, default=6.0,
                        help="every process exits this many seconds after the fork (default 6)")
    parser.add_argument("--leak-after", type=float, default=0.5,
                        help="seconds the leaker waits after the fork before leaking (default 0.5)")
    parser.add_argument("--grow-seconds", type=float, default=2.0,
                        help="seconds over which the leak is spread, in 1 MiB steps (default 2)")
    parser.add_argument("--start-delay", type=float, default=0.0,
                        help="seconds the master waits before forking, so a tracer can attach (default 0)")
    args = parser.parse_args(argv)
    if args.workers < 1 or not 0 <= args.leaker < args.workers:
        parser.error(f"need --workers >= 1 and 0 <= --leaker < --workers, got {args.workers} and {args.leaker}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Fork the workers, print who leaks, wait for them; exit 0 when every worker exited 0."""
    args = parse_args(argv)
    emit("ready", start_delay_seconds=args.start_delay)
    wait_for_start(args.start_delay)
    deadline = time.monotonic() + args.seconds
    workers = {index: fork_worker(index, args, deadline) for index in range(args.workers)}
    emit("forked", workers={str(i): pid for i, pid in workers.items()}, leaker_index=args.leaker,
         leaker_pid=workers[args.leaker], leak_bytes=int(args.mib * MIB))
    exit_codes = {}
    for index, pid in workers.items():
        _pid, status = os.waitpid(pid, 0)
        exit_codes[str(index)] = os.waitstatus_to_exitcode(status)
    emit("exit", worker_exit_codes=exit_codes)
    return 0 if all(code == 0 for code in exit_codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
