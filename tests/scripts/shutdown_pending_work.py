"""Test workload (shutdown): pending work piles up linearly, then the service clears it in its own shutdown path.

:class:`Service` receives one job every ``--interval`` seconds for
``--seconds`` seconds in :func:`Service.submit` and never works any off:
each job (``--job-kib`` KiB of distinct ``bytes`` rows) waits in the
pending list, so resident memory grows linearly to about ``--mib`` MiB
(a steady leak). Then :func:`Service.shutdown`, called on the way out of
``main``, clears the pending list (pymalloc returns its emptied arenas)
and the process exits right after, as a service's shutdown hook does.

Output (JSON lines, see ``workload_common.py``; RSS in bytes, from
``/proc/self/statm``):

* ``{"event": "piled", "pid": ..., "function": "submit", "jobs": ...,
  "rss_before_bytes": ..., "rss_peak_bytes": ...}`` when the last job is queued;
* ``{"event": "shut_down", "pid": ..., "rss_after_bytes": ...}`` after the clear,
  right before returning from ``main``.

Run::

    python shutdown_pending_work.py --mib 280 --seconds 6
"""

from __future__ import annotations

import argparse
import sys
import time

from workload_common import MIB, emit, rss_bytes

#: Payload bytes of each row of a job (a repeated 8-digit number, so rows differ).
ROW_PAYLOAD_BYTES = 384

#: Bytes a row holds: its object (384 + the 33-byte header, in the 432-byte pymalloc class) and its list slot.
ROW_BYTES = 432 + 8


class Service:
    """A service whose pending jobs are only released by :meth:`shutdown`."""

    def __init__(self) -> None:
        self.pending: list[list[bytes]] = []

    def submit(self, job_bytes: int) -> None:
        """Queue one job of about ``job_bytes`` bytes of distinct rows."""
        repeat = ROW_PAYLOAD_BYTES // 8
        base = len(self.pending) * 1_000_000
        rows = [(b"%08d" % (base + i)) * repeat for i in range(job_bytes // ROW_BYTES)]
        self.pending.append(rows)

    def shutdown(self) -> None:
        """Drop every pending job (the service's own shutdown hook)."""
        self.pending.clear()


def main(argv: list[str] | None = None) -> int:
    """Pile up jobs for ``--seconds``, shut the service down, exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=280.0, help="MiB of pending work at the end (default 280)")
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds jobs arrive (default 6)")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between two jobs (default 0.05)")
    args = parser.parse_args(argv)
    jobs = max(1, int(args.seconds / args.interval))
    job_bytes = int(args.mib * MIB) // jobs
    service = Service()
    time.sleep(0.5)
    before = rss_bytes()
    started = time.monotonic()
    for index in range(jobs):
        service.submit(job_bytes)
        time.sleep(max(0.0, started + (index + 1) * args.interval - time.monotonic()))
    emit("piled", function="submit", jobs=jobs, rss_before_bytes=before, rss_peak_bytes=rss_bytes())
    service.shutdown()
    emit("shut_down", rss_after_bytes=rss_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
