"""Test workload (repeated spikes): a parser fed ``--payloads`` large payloads in a row, each parsed, used and dropped.

For each payload, :func:`parse_payload` builds a JSON document of about
``--mib`` MiB (a list of distinct small records), parses it with
``json.loads`` into Python objects, sums a field and drops both, so
resident memory rises and falls back once per payload. ``--gap`` seconds
pass between payloads, and the process idles ``--idle`` seconds before the
first and after the last. Stdlib only; everything is bounded.

Output (JSON lines, see ``workload_common.py``; RSS in bytes):
``{"event": "parsed", "pid": ..., "function": "parse_payload", "index": i,
"rss_before_bytes": ..., "rss_peak_bytes": ..., "rss_after_bytes": ...}`` per payload.

Run::

    python parse_payloads.py --payloads 4 --mib 20 --gap 0.8
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from workload_common import MIB, emit, rss_bytes

#: Bytes of one record in the JSON text (about).
RECORD_TEXT_BYTES = 64


def parse_payload(index: int, target_bytes: int) -> tuple[int, int]:
    """Build, parse and use one payload of about ``target_bytes`` of JSON; return ``(sum, RSS at the peak)``."""
    records = target_bytes // RECORD_TEXT_BYTES
    text = "[" + ",".join('{"id":%d,"name":"item-%08d-%d"}' % (i, i, index) for i in range(records)) + "]"
    parsed = json.loads(text)
    peak = rss_bytes()
    total = sum(item["id"] for item in parsed)
    return total, peak


def main(argv: list[str] | None = None) -> int:
    """Idle, parse the payloads one after another, idle; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payloads", type=int, default=4, help="payloads parsed in a row (default 4)")
    parser.add_argument("--mib", type=float, default=20.0, help="MiB of JSON text per payload (default 20)")
    parser.add_argument("--gap", type=float, default=0.8, help="seconds between payloads (default 0.8)")
    parser.add_argument("--idle", type=float, default=1.5, help="seconds idle before and after (default 1.5)")
    args = parser.parse_args(argv)
    time.sleep(args.idle)
    for index in range(args.payloads):
        before = rss_bytes()
        _total, peak = parse_payload(index, int(args.mib * MIB))
        emit("parsed", function="parse_payload", index=index, rss_before_bytes=before, rss_peak_bytes=peak,
             rss_after_bytes=rss_bytes())
        time.sleep(args.gap)
    time.sleep(args.idle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
