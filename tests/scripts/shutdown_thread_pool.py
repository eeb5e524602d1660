"""Test workload (shutdown): a thread pool's threads keep their buffers until ``pool.shutdown()`` at the very end.

A ``ThreadPoolExecutor`` of ``--threads`` threads runs one task per thread
in :func:`fill_buffer`: each keeps a ``bytearray`` of ``--mib / --threads``
MiB (written, so resident) in its thread-local state, and touches it again
every ``--tick`` seconds for ``--seconds`` seconds (the pool serving work).
Then :func:`release_buffers` tells the threads to drop their buffers and
``pool.shutdown(wait=True)`` joins them, right before ``main`` returns.

Output (JSON lines, see ``workload_common.py``; RSS in bytes):

* ``{"event": "filled", "pid": ..., "function": "fill_buffer", "rss_before_bytes": ...,
  "rss_peak_bytes": ...}`` once every thread holds its buffer;
* ``{"event": "shut_down", "pid": ..., "rss_after_bytes": ...}`` after ``pool.shutdown()``.

Run::

    python shutdown_thread_pool.py --threads 4 --mib 280 --seconds 5
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from workload_common import MIB, emit, rss_bytes

#: Bytes between two written bytes of a buffer (one per page makes it resident).
PAGE_BYTES = 4096


def fill_buffer(buffer_bytes: int, tick: float, ready: threading.Barrier, stop: threading.Event) -> int:
    """Keep a written buffer of ``buffer_bytes`` in this thread, touching it every ``tick`` s until ``stop``."""
    local = threading.local()
    local.buffer = bytearray(buffer_bytes)
    for offset in range(0, buffer_bytes, PAGE_BYTES):
        local.buffer[offset] = 1
    ready.wait()
    touched = 0
    while not stop.wait(tick):
        local.buffer[touched % buffer_bytes] ^= 1
        touched += PAGE_BYTES
    del local.buffer
    return touched


def release_buffers(stop: threading.Event) -> None:
    """Tell the pool's threads to drop their buffers."""
    stop.set()


def main(argv: list[str] | None = None) -> int:
    """Fill the pool's buffers, serve for ``--seconds``, shut the pool down, exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=4, help="pool threads (default 4)")
    parser.add_argument("--mib", type=float, default=280.0, help="MiB of buffers over all threads (default 280)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds the pool serves (default 5)")
    parser.add_argument("--tick", type=float, default=0.05, help="seconds between two touches (default 0.05)")
    args = parser.parse_args(argv)
    time.sleep(0.5)
    before = rss_bytes()
    ready = threading.Barrier(args.threads + 1)
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=args.threads)
    buffer_bytes = int(args.mib * MIB) // args.threads
    futures = [pool.submit(fill_buffer, buffer_bytes, args.tick, ready, stop) for _ in range(args.threads)]
    ready.wait()
    emit("filled", function="fill_buffer", rss_before_bytes=before, rss_peak_bytes=rss_bytes())
    time.sleep(args.seconds)
    release_buffers(stop)
    pool.shutdown(wait=True)
    for future in futures:
        future.result()
    emit("shut_down", rss_after_bytes=rss_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
