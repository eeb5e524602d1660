"""Test workload of allocator mode's fragmentation diagnosis: ``build_and_thin`` creates
``--mib`` MiB of small ``bytes`` objects (417 bytes: pymalloc-sized), then frees all but
every ``--keep-every``-th one (kept in a module-level list until the interpreter
finalizes). A 417-byte object sits in a 16 KiB pymalloc pool with 36
others, so the survivors pin every pool and every arena: the objects are gone, the
resident memory stays (pymalloc returns an arena only once all its pools are empty).
The process then holds for ``--hold`` seconds and exits.

Output (JSON lines, see ``workload_common.py``):

* ``{"event": "thinned", "pid": ..., "function": "build_and_thin", "built_bytes": ...,
  "kept_bytes": ..., "rss_anon_bytes": ..., "vm_rss_bytes": ..., "pymalloc_live_bytes": ...,
  "glibc_in_use_bytes": ..., "glibc_free_bytes": ..., "glibc_mmapped_bytes": ...}``:
  ``sys.getsizeof`` sums of all objects built and of the survivors (with their list),
  ``RssAnon``/``VmRSS`` of ``/proc/self/status`` after thinning, and the allocators' own
  totals (``census_truth.py``).

Run::

    python alloc_fragment.py --mib 200 --keep-every 32 --hold 1.5 --start-delay 0.5
"""

from __future__ import annotations

import argparse
import sys
import time

from census_truth import glibc_totals, pymalloc_live_bytes
from workload_common import MIB, emit, proc_status, wait_for_start

#: Payload of each object: 384 + the 33-byte bytes header = 417 bytes.
PAYLOAD_BYTES = 384

#: The survivors, kept until the interpreter finalizes.
_KEPT: list[bytes] = []


def build_and_thin(target_bytes: int, keep_every: int) -> int:
    """Build small objects totalling ``target_bytes``, keep every ``keep_every``-th of
    them in ``_KEPT`` (the rest are freed when the full list goes); return their size."""
    built = []
    total = 0
    index = 0
    while total < target_bytes:
        obj = index.to_bytes(8, "little") * (PAYLOAD_BYTES // 8)
        built.append(obj)
        total += sys.getsizeof(obj)
        index += 1
    _KEPT.extend(built[::keep_every])
    del built
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--keep-every", type=int, default=32)
    parser.add_argument("--hold", type=float, default=1.5)
    parser.add_argument("--start-delay", type=float, default=0.0)
    args = parser.parse_args()
    wait_for_start(args.start_delay)
    built = build_and_thin(args.mib * MIB, args.keep_every)
    kept_bytes = sum(sys.getsizeof(obj) for obj in _KEPT) + sys.getsizeof(_KEPT)
    status = proc_status()
    emit("thinned", function="build_and_thin", built_bytes=built, kept_bytes=kept_bytes,
         rss_anon_bytes=status["RssAnon"], vm_rss_bytes=status["VmRSS"],
         pymalloc_live_bytes=pymalloc_live_bytes(), **glibc_totals())
    time.sleep(args.hold)


if __name__ == "__main__":
    main()
