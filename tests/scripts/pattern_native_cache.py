"""Test workload (native memory): a named function fills SQLite's page cache, which libsqlite3 allocates itself.

:func:`fill_page_cache` opens an in-memory database with a page cache of
up to 400 MB and inserts ``--mib`` MiB of random blobs; the connection is
kept open, so the pages stay resident, then the process idles
``--idle-after`` seconds. The memory is malloc'd and first touched by
libsqlite3's own code (its page cache), not by the interpreter: memtrace
should name ``fill_page_cache`` and say the memory is native, in
libsqlite3.

Output (JSON lines, see ``workload_common.py``): ``{"event": "filled",
"pid": ..., "function": "fill_page_cache", "rss_before_bytes": ...,
"rss_after_bytes": ...}``.

Run::

    python pattern_native_cache.py --mib 80 --idle-after 2
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time

from workload_common import MIB, emit, rss_bytes

#: Bytes of each inserted blob.
BLOB_BYTES = 1000


def fill_page_cache(conn: sqlite3.Connection, target_bytes: int) -> None:
    """Insert ``target_bytes`` of random blobs into a table of ``conn`` (all of it stays in SQLite's page cache)."""
    conn.execute("PRAGMA cache_size=-400000")
    conn.execute("CREATE TABLE blobs (id INTEGER PRIMARY KEY, payload BLOB)")
    rows = target_bytes // BLOB_BYTES
    conn.executemany(
        "INSERT INTO blobs (payload) VALUES (randomblob(?))",
        ((BLOB_BYTES,) for _ in range(rows)),
    )
    conn.commit()


def main(argv: list[str]) -> int:
    """Fill the cache, report the workload's own RSS, then idle with the connection open."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=80, help="MiB of blobs to insert (default 80)")
    parser.add_argument("--idle-after", type=float, default=2.0, help="seconds to idle after (default 2)")
    args = parser.parse_args(argv)
    conn = sqlite3.connect(":memory:")
    before = rss_bytes()
    fill_page_cache(conn, args.mib * MIB)
    emit("filled", function="fill_page_cache", rss_before_bytes=before, rss_after_bytes=rss_bytes())
    time.sleep(args.idle_after)
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
