"""The allocators' own totals of the calling process, as they report them (the truth the
census tests compare memtrace's outside reading with):

* :func:`pymalloc_live_bytes`: ``# bytes in allocated blocks`` of ``sys._debugmallocstats()``
  (pymalloc's live blocks: the sum over pools of in-use blocks times block size); the
  function writes to the C-level stderr, so fd 2 is redirected into a temporary file;
* :func:`glibc_totals`: ``mallinfo2()`` of glibc (2.33+), via ctypes: ``uordblks`` (bytes in
  chunks in use, every arena), ``fordblks`` (free bytes, every arena, tcache and fastbin
  chunks counted in use), ``hblkhd`` (bytes in mmapped chunks).

Imported by the census workloads (``census_thread_arenas.py``, ``alloc_fragment.py``).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import tempfile


def pymalloc_live_bytes() -> int:
    """Bytes in pymalloc's allocated blocks, from ``sys._debugmallocstats()``."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode()
    match = re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text)
    return int(match.group(1).replace(",", "")) if match else -1


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def glibc_totals() -> dict[str, int]:
    """``mallinfo2()``'s ``uordblks``, ``fordblks`` and ``hblkhd``, in bytes."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    return {"glibc_in_use_bytes": info.uordblks, "glibc_free_bytes": info.fordblks,
            "glibc_mmapped_bytes": info.hblkhd}
