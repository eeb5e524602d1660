"""Test workload of ``memtrace record --pid --allocations`` into a running process.

Started without memtrace. Prints ``ready``, then waits (running Python code,
so that CPython's remote-debugging request is taken at once) for the file
``--go`` to exist; then ``keep_small_objects`` keeps ``--keep-mib`` MiB of
small objects and ``churn`` allocates and frees ``--churn-mib`` MiB, as in
``alloc_leak_churn.py``. It then waits for the file ``--after`` (memtrace has
detached), frees what it kept, allocates and frees again, and prints a
checksum of everything it made: the same whether memtrace attached or not.

Output (JSON lines, see ``workload_common.py``): ``ready``; ``kept`` (with
``getsizeof_bytes``); ``churned`` (with ``allocated_bytes``); ``done`` (with
``checksum``).

Run::

    python alloc_remote_target.py --keep-mib 100 --churn-mib 400 --go FILE --after FILE
"""

from __future__ import annotations

import argparse
import hashlib

from alloc_leak_churn import _KEPT, churn, keep_small_objects
from workload_common import MIB, emit, wait_for_start

#: Longest wait for each file, in seconds.
WAIT_SECONDS = 120.0


def after_detach(keep_bytes: int, churn_bytes: int) -> str:
    """Free the kept objects, then make and drop the same again; a digest of all."""
    digest = hashlib.sha256()
    for obj in _KEPT:
        digest.update(obj[:8])
    _KEPT.clear()
    keep_small_objects(keep_bytes)
    for obj in _KEPT:
        digest.update(obj[:8])
    _KEPT.clear()
    digest.update(str(churn(churn_bytes)).encode())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep-mib", type=int, required=True)
    parser.add_argument("--churn-mib", type=int, required=True)
    parser.add_argument("--go", required=True)
    parser.add_argument("--after", required=True)
    args = parser.parse_args()
    emit("ready")
    wait_for_start(WAIT_SECONDS, args.go)
    kept = keep_small_objects(args.keep_mib * MIB)
    emit("kept", function="keep_small_objects", getsizeof_bytes=kept)
    churned = churn(args.churn_mib * MIB)
    emit("churned", function="churn", allocated_bytes=churned)
    wait_for_start(WAIT_SECONDS, args.after)
    emit("done", checksum=after_detach(args.keep_mib * MIB, args.churn_mib * MIB))


if __name__ == "__main__":
    main()
