"""Test workload: write a ``--file-mib`` MiB file, ``mmap`` it read-only and read every page in ``read_slices``.

The script writes the file in 1 MiB chunks from one reused buffer (so its
anonymous memory stays small), maps it with ``mmap.mmap(fd, 0,
prot=PROT_READ)`` and then :func:`read_slices` reads it in ``--slice-kib``
KiB slices (each slice is copied into a temporary ``bytes``, checksummed
with ``zlib.crc32`` and dropped), so every page of the mapping is faulted
in. The pages are the file's page cache: the resident growth is
file-backed (``RssFile`` grows by about the file size) while ``RssAnon``
stays within a few MiB. The script holds the mapping for
``--hold-seconds``, then closes it, removes what it created and exits 0.

``--dir`` is where the file goes; by default a new ``tempfile.mkdtemp``
directory under ``/tmp``, removed at the end. A file on tmpfs (or ramfs)
is shared memory, not a regular file: its mapped pages count in
``RssShmem`` instead of ``RssFile``. So when ``/tmp`` is a tmpfs and
``--dir`` is not given, the directory is made under ``/var/tmp`` instead;
``dir_fs_type`` in the output names the file system used.

Output (JSON lines, see ``workload_common.py``; ``status*`` are
:func:`workload_common.proc_status` dicts, in bytes):

* ``{"event": "mapped", "pid": ..., "path": ..., "dir_fs_type": "ext4", "file_bytes": ...,
  "status": {...}}`` after writing and mapping the file, before reading it;
* ``{"event": "read", "pid": ..., "function": "read_slices", "file_bytes": ..., "slice_bytes": ...,
  "slices": ..., "crc32": ..., "status": {...}, "file_growth_bytes": <RssFile now - at mapped>,
  "shmem_growth_bytes": <RssShmem now - at mapped>, "anon_growth_bytes": <RssAnon now - at mapped>}``
  after reading, while the mapping is still open;
* ``{"event": "exit", "pid": ..., "status": {...}}`` after unmapping and removing the file.

Run::

    python read_mapped_file.py --file-mib 200 --slice-kib 64 --hold-seconds 1
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import sys
import tempfile
import time
import zlib

from workload_common import MIB, emit, proc_status

#: Bytes per write while creating the file (one reused buffer).
CHUNK_BYTES = MIB

#: File systems whose files are shared memory: their mapped pages count in ``RssShmem``.
SHMEM_FS_TYPES = frozenset({"tmpfs", "ramfs"})


def fs_type(path: str) -> str:
    """Return the type of the file system holding ``path`` (``/proc/self/mountinfo``, longest mount point)."""
    path = os.path.realpath(path)
    best, best_type = "", "unknown"
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            separator = fields.index("-")
            mount_point = fields[4].encode().decode("unicode_escape")
            inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(best):
                best, best_type = mount_point, fields[separator + 1]
    return best_type


def write_file(path: str, size_bytes: int) -> None:
    """Create ``path`` with ``size_bytes`` bytes, written in :data:`CHUNK_BYTES` chunks from one reused buffer."""
    chunk = bytearray(b"memtrace" * (CHUNK_BYTES // 8))
    view = memoryview(chunk)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        while written < size_bytes:
            chunk[:16] = b"%016d" % written  # each chunk differs
            part = view[:min(CHUNK_BYTES, size_bytes - written)]
            while part:
                part = part[os.write(fd, part):]
            written += min(CHUNK_BYTES, size_bytes - written)
    finally:
        os.close(fd)


def read_slices(mapping: mmap.mmap, slice_bytes: int) -> tuple[int, int]:
    """Read ``mapping`` in ``slice_bytes`` slices (each copied, checksummed, dropped); return ``(slices, crc32)``."""
    crc = 0
    slices = 0
    for offset in range(0, len(mapping), slice_bytes):
        crc = zlib.crc32(mapping[offset:offset + slice_bytes], crc)
        slices += 1
    return slices, crc


def main(argv: list[str] | None = None) -> int:
    """Write, map, read, report, hold, clean up; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file-mib", type=float, default=200.0, help="MiB of the file (default 200)")
    parser.add_argument("--dir", default=None,
                        help="directory for the file (default: a new temporary directory under /tmp, "
                             "or /var/tmp if /tmp is a tmpfs; removed at the end)")
    parser.add_argument("--slice-kib", type=int, default=64, help="KiB read per slice (default 64)")
    parser.add_argument("--hold-seconds", type=float, default=1.0,
                        help="seconds to keep the mapping after reading (default 1)")
    args = parser.parse_args(argv)
    size = int(args.file_mib * MIB)
    if size <= 0 or args.slice_kib <= 0:
        parser.error("need --file-mib > 0 and --slice-kib > 0")
    made_dir = None
    if args.dir is None:
        parent = "/var/tmp" if fs_type("/tmp") in SHMEM_FS_TYPES else "/tmp"
        made_dir = directory = tempfile.mkdtemp(prefix="memtrace-mapped-", dir=parent)
    else:
        directory = args.dir
    path = os.path.join(directory, f"mapped-{os.getpid()}.bin")
    try:
        write_file(path, size)
        fd = os.open(path, os.O_RDONLY)
        try:
            mapping = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)  # the mapping keeps the file open
        try:
            mapped = proc_status()
            emit("mapped", path=path, dir_fs_type=fs_type(directory), file_bytes=size, status=mapped)
            slices, crc = read_slices(mapping, args.slice_kib * 1024)
            now = proc_status()
            emit("read", function="read_slices", file_bytes=size, slice_bytes=args.slice_kib * 1024,
                 slices=slices, crc32=crc, status=now,
                 file_growth_bytes=now["RssFile"] - mapped["RssFile"],
                 shmem_growth_bytes=now["RssShmem"] - mapped["RssShmem"],
                 anon_growth_bytes=now["RssAnon"] - mapped["RssAnon"])
            time.sleep(max(0.0, args.hold_seconds))
        finally:
            mapping.close()
    finally:
        if made_dir is not None:
            shutil.rmtree(made_dir, ignore_errors=True)
        elif os.path.exists(path):
            os.remove(path)
    emit("exit", status=proc_status())
    return 0


if __name__ == "__main__":
    sys.exit(main())
