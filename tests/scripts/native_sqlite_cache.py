"""Test workload of mixed Python + native stacks: ``lookup_customer_total`` opens a
SQLite connection with a page cache big enough for the whole database, reads
every page of a ``--mib`` MiB table through one query, and keeps the
connection open (its page cache stays allocated, inside libsqlite3's
``pcache1Alloc``, until exit).

The database is built first (by ``build_database``, in a temporary
directory) and its connection closed, so the pages ``lookup_customer_total``
caches are read by its own query. The function runs after ``--start-delay``
seconds (memtrace attaches a process's allocator probes tens of milliseconds
after it starts).

Output (JSON lines, see ``workload_common.py``):

* ``{"event": "cached", "pid": ..., "function": "lookup_customer_total",
  "sqlite_memory_bytes": ..., "table_bytes": ...}``: how much libsqlite3's own
  allocator counter (``sqlite3_status64(SQLITE_STATUS_MEMORY_USED)``) grew
  during the function, and the payload bytes the query summed.

Run::

    python native_sqlite_cache.py --mib 32 --start-delay 0.5
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sqlite3
import tempfile

from workload_common import MIB, emit, wait_for_start

#: Bytes of each row's payload.
ROW_PAYLOAD_BYTES = 2000
#: `sqlite3_status64` operation: memory held by SQLite's allocator.
SQLITE_STATUS_MEMORY_USED = 0

_CONNECTIONS: list[sqlite3.Connection] = []


def libsqlite3() -> ctypes.CDLL:
    """The libsqlite3 that the ``sqlite3`` module mapped into this process."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "libsqlite3" in path:
                return ctypes.CDLL(path)
    raise RuntimeError("libsqlite3 is not mapped")


def memory_used(lib: ctypes.CDLL) -> int:
    """SQLite's own count of bytes its allocator holds."""
    current = ctypes.c_int64()
    highwater = ctypes.c_int64()
    lib.sqlite3_status64(
        SQLITE_STATUS_MEMORY_USED, ctypes.byref(current), ctypes.byref(highwater), 0
    )
    return current.value


def build_database(path: str, target_bytes: int) -> None:
    """Create table ``orders`` with ``target_bytes`` of payload at ``path``."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER, payload BLOB)")
    rows = target_bytes // ROW_PAYLOAD_BYTES
    conn.executemany(
        "INSERT INTO orders (customer, payload) VALUES (?, ?)",
        ((i % 97, os.urandom(ROW_PAYLOAD_BYTES)) for i in range(rows)),
    )
    conn.commit()
    conn.close()


def lookup_customer_total(path: str) -> int:
    """Open a connection with a large page cache, read every page, keep it open."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA cache_size = -1000000")
    (total,) = conn.execute("SELECT sum(length(payload)) FROM orders").fetchone()
    _CONNECTIONS.append(conn)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--start-delay", type=float, default=0.0)
    args = parser.parse_args()
    lib = libsqlite3()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "orders.db")
        build_database(path, args.mib * MIB)
        wait_for_start(args.start_delay)
        before = memory_used(lib)
        table = lookup_customer_total(path)
        grown = memory_used(lib) - before
        emit(
            "cached",
            function="lookup_customer_total",
            sqlite_memory_bytes=grown,
            table_bytes=table,
        )


if __name__ == "__main__":
    main()
