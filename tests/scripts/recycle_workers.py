"""Test workload: a master runs N short-lived workers one at a time on reused pids; each grows in ``work_in_child``.

Worker ``i`` (``0 <= i < --workers``) is forked only after worker ``i - 1``
was reaped. As root, the master picks ``--pid-slots`` free pids at start
(the first free ones counting down from ``<master pid> - 1000``: pids below
the kernel's allocation cursor are only handed out again after the pids
wrap around ``pid_max``, so other processes on the machine do not take
them meanwhile) and, before forking worker ``i``, writes ``target - 1`` to
``/proc/sys/kernel/ns_last_pid`` (target: slot ``i % --pid-slots``) so that
the fork gets pid ``target``, then writes the previous cursor back (so the
rest of the machine keeps allocating where it was): workers ``i`` and
``i + --pid-slots`` run on the same pid, one after the other. If a slot's
pid got taken meanwhile, a new free one replaces it. Without the privilege
(or if the write fails) it just forks and says so in the ``forked`` event
(``pid_control``). A process forking elsewhere between the write and the
fork can steal the target pid (the worker then usually gets ``target + 1``,
another slot's pid; seen about once per run while another process forks
in a tight loop, never on a quiet machine): ``reused`` says, per worker,
whether the pid is the target.

Worker ``i`` runs :func:`work_in_child`, which appends distinct 432-byte
``bytes`` objects to the module-level list ``_HELD`` until
``--base-mib + 4 * (i % 5)`` MiB (``sys.getsizeof`` of the objects plus
their 8-byte list slots) are held, reports, holds its memory until
``--worker-seconds`` after its fork, and exits with code ``i % 4`` (so the
exit statuses of the workers on one pid differ). Stdlib only; bounded
(about ``--workers * (--worker-seconds + 0.01)`` seconds: 10 s by default, after
``--start-file`` appeared or ``--start-delay`` passed).

Output (JSON lines, see ``workload_common.py``; ``status`` is a
:func:`workload_common.proc_status` dict, in bytes):

* master: ``{"event": "ready", "pid": ..., "pid_control": "ns_last_pid" | "none",
  "pid_control_error": null | "...", "pid_max": ...}`` at start; per worker
  ``{"event": "forked", "pid": <master>, "index": i, "worker_pid": ..., "target_pid": ... | null,
  "reused": <worker_pid == target_pid>, "mib": ..., "pid_control": ..., "pid_control_error": ...}``
  and ``{"event": "reaped", "pid": <master>, "index": i, "worker_pid": ...,
  "wait_status": <raw waitpid status>, "exit_code": <os.waitstatus_to_exitcode>,
  "expected_exit_code": i % 4}``; at the end ``{"event": "exit", "pid": <master>,
  "workers": ..., "reused": <workers on their target pid>, "distinct_pids": ...,
  "exit_codes": {"0": 0, ...}}``;
* each worker: ``{"event": "worker_done", "pid": ..., "index": i, "function": "work_in_child",
  "mib": ..., "held_bytes": ..., "objects": ..., "start_time_ticks": ..., "growth_bytes":
  <RssAnon after - before>, "status_before": {...}, "status": {...}}`` after growing.

Run::

    python recycle_workers.py --workers 32 --pid-slots 4 --base-mib 8 --worker-seconds 0.3
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from workload_common import MIB, emit, proc_status, start_time_ticks, wait_for_start

#: Payload bytes of each object: with the 33-byte ``bytes`` header, 432 bytes,
#: a multiple of pymalloc's 16-byte size classes (no rounding slack).
OBJECT_PAYLOAD_BYTES = 399

#: Bytes of one list slot (a pointer), counted with each object.
SLOT_BYTES = 8

#: The kernel's "last pid handed out" of this pid namespace (writable with CAP_SYS_ADMIN).
NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"

#: Pids below this are not handed out again once pids wrapped (the kernel's RESERVED_PIDS).
RESERVED_PIDS = 300

#: The worker's memory: filled by :func:`work_in_child`, held until the worker exits.
_HELD: list[bytes] = []


def work_in_child(mib: int) -> tuple[int, int]:
    """Append distinct bytes objects to ``_HELD`` until ``mib`` MiB are held; return ``(objects, bytes held)``.

    Counted per object: ``sys.getsizeof`` (432) plus its list slot (8).
    """
    target_bytes = mib * MIB
    held = 0
    count = 0
    while held < target_bytes:
        item = ((b"%08d" % count) * 50)[:OBJECT_PAYLOAD_BYTES]
        _HELD.append(item)
        held += sys.getsizeof(item) + SLOT_BYTES
        count += 1
    return count, held


def run_worker(index: int, mib: int, deadline: float) -> None:
    """Body of worker ``index``: grow ``mib`` MiB, report, hold until ``deadline``."""
    before = proc_status()
    objects, held = work_in_child(mib)
    after = proc_status()
    emit("worker_done", index=index, function="work_in_child", mib=mib, held_bytes=held, objects=objects,
         start_time_ticks=start_time_ticks(), growth_bytes=after["RssAnon"] - before["RssAnon"],
         status_before=before, status=after)
    time.sleep(max(0.0, deadline - time.monotonic()))


def pid_max() -> int:
    """Return the kernel's ``pid_max`` (pids are below it)."""
    with open("/proc/sys/kernel/pid_max") as value:
        return int(value.read())


def pid_in_use(pid: int) -> bool:
    """Return whether a process or thread has pid ``pid`` (``/proc/<pid>`` exists, for thread ids too)."""
    return os.path.exists(f"/proc/{pid}")


def free_pids(start: int, count: int, limit: int, avoid: set[int]) -> list[int]:
    """Return ``count`` free pids counting down from ``start`` (wrapping below ``limit``), none in ``avoid``."""
    span = limit - RESERVED_PIDS
    found: list[int] = []
    candidate = start
    for _ in range(span):
        candidate = RESERVED_PIDS + (candidate - RESERVED_PIDS) % span
        if candidate not in avoid and not pid_in_use(candidate):
            found.append(candidate)
            if len(found) == count:
                return found
        candidate -= 1
    raise RuntimeError("not enough free pids")


def read_last_pid(control_fd: int) -> int:
    """Return the pid namespace's allocation cursor (the pid handed out last) from the open :data:`NS_LAST_PID`."""
    return int(os.pread(control_fd, 32, 0))


def write_last_pid(control_fd: int, value: int) -> str | None:
    """Set the cursor to ``value`` (the next fork gets ``value + 1`` if free); return None or the error.

    ``pwrite`` at offset 0 of the already open file: the shortest window
    between this write and the fork, in which another process's fork could
    take the pid.
    """
    try:
        os.pwrite(control_fd, str(value).encode(), 0)
        return None
    except OSError as error:
        return f"{type(error).__name__}: {error}"


def fork_worker(index: int, mib: int, worker_seconds: float) -> int:
    """Fork worker ``index``; the child runs :func:`run_worker` and exits with ``index % 4``."""
    pid = os.fork()
    if pid == 0:
        exit_code = 100
        try:
            run_worker(index, mib, time.monotonic() + worker_seconds)
            exit_code = index % 4
        except BaseException:  # noqa: BLE001 (the child must never return into the master's code)
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            os._exit(exit_code)
    return pid


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the workload's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=32, help="workers to run, one after another (default 32)")
    parser.add_argument("--pid-slots", type=int, default=4,
                        help="distinct pids the workers cycle through, as root (default 4)")
    parser.add_argument("--base-mib", type=int, default=8,
                        help="worker i grows BASE + 4 * (i %% 5) MiB (default 8)")
    parser.add_argument("--worker-seconds", type=float, default=0.3,
                        help="each worker exits this many seconds after its fork (default 0.3)")
    parser.add_argument("--start-file",
                        help="after the ready event, fork the first worker only once this file exists "
                             "(or --start-delay passed)")
    parser.add_argument("--start-delay", type=float, default=0.0,
                        help="seconds to wait after the ready event, at most, for --start-file (default 0)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.pid_slots < 1 or args.base_mib < 0 or args.worker_seconds < 0:
        parser.error("need --workers >= 1, --pid-slots >= 1, --base-mib >= 0, --worker-seconds >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the workers one by one, each on its steered pid; exit 0 when every exit code was the expected one."""
    args = parse_args(argv)
    master = os.getpid()
    limit = pid_max()
    control_fd = -1
    if os.geteuid() != 0:
        pid_control, control_error = "none", "not root: forking without choosing the pid"
    else:
        try:
            control_fd = os.open(NS_LAST_PID, os.O_RDWR)
            pid_control, control_error = "ns_last_pid", None
        except OSError as error:
            pid_control, control_error = "none", f"{type(error).__name__}: {error}"
    emit("ready", pid_control=pid_control, pid_control_error=control_error, pid_max=limit)
    wait_for_start(args.start_delay, args.start_file)
    slots: list[int] = []
    if pid_control == "ns_last_pid":
        slots = free_pids(master - 1000, args.pid_slots, limit, set())
    exit_codes: dict[str, int] = {}
    worker_pids: list[int] = []
    reused = 0
    for index in range(args.workers):
        mib = args.base_mib + 4 * (index % 5)
        target = None
        error = control_error
        if pid_control == "ns_last_pid":
            slot = index % args.pid_slots
            if pid_in_use(slots[slot]):
                slots[slot] = free_pids(slots[slot], 1, limit, set(slots))[0]
            target = slots[slot]
            try:
                cursor = read_last_pid(control_fd)
            except (OSError, ValueError) as read_error:
                cursor, error = None, f"{type(read_error).__name__}: {read_error}"
            else:
                error = write_last_pid(control_fd, target - 1)
            if error is not None:
                target = None
            pid = fork_worker(index, mib, args.worker_seconds)
            if error is None and cursor is not None and cursor != target - 1:
                write_last_pid(control_fd, cursor)
        else:
            pid = fork_worker(index, mib, args.worker_seconds)
        worker_pids.append(pid)
        on_target = pid == target
        reused += on_target
        emit("forked", index=index, worker_pid=pid, target_pid=target, reused=on_target, mib=mib,
             pid_control=pid_control if error is None else "none", pid_control_error=error)
        _pid, status = os.waitpid(pid, 0)
        exit_codes[str(index)] = os.waitstatus_to_exitcode(status)
        emit("reaped", index=index, worker_pid=pid, wait_status=status, exit_code=exit_codes[str(index)],
             expected_exit_code=index % 4)
    if control_fd >= 0:
        os.close(control_fd)
    emit("exit", workers=args.workers, reused=reused, distinct_pids=len(set(worker_pids)), exit_codes=exit_codes)
    return 0 if all(exit_codes[str(i)] == i % 4 for i in range(args.workers)) else 1


if __name__ == "__main__":
    sys.exit(main())
