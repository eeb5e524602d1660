"""Request handling of the pre-fork demo service: one cheap, one transient, one leaking endpoint.

This module is what memtrace is expected to point at. Its three endpoints
have three different memory behaviours:

``/health``
    Allocates almost nothing.
``/items?n=K``
    Builds K item records, serializes them, and drops them before replying:
    memory is *transient*, the process returns to its previous size.
``/report?customer=ID``
    Builds about 900 KiB of report rows (a list of dicts of strings) in
    :func:`render_report` and keeps them forever in the module-level
    ``_REPORT_CACHE`` under a key that is unique per request. The cache is
    unbounded, so every worker that serves ``/report`` grows by about
    900 KiB per request: *retained* memory, never given back.

All allocation loops are explicit ``for`` loops, not comprehensions, so the
innermost Python frame of every allocation is the named function itself on
every CPython version (3.11 gives comprehensions their own ``<listcomp>``
frame; 3.12 inlines them).
"""

from __future__ import annotations

import itertools
import json
import os
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

#: Rows in one report; with :data:`REPORT_NOTE_CHARS` this makes one report
#: about 900 KiB of Python objects (``sys.getsizeof`` sums: ~916 KiB on
#: CPython 3.11.7).
REPORT_ROWS = 1600

#: Length of the free-text note in each report row, in characters (ASCII, so bytes).
REPORT_NOTE_CHARS = 200

#: Largest ``n`` accepted by ``/items``; larger values are clamped.
MAX_ITEMS = 20_000

#: The leak: report rows per cache key, never evicted. Keys are unique per
#: request (customer id plus a per-process sequence number), so the cache
#: grows by one report per ``/report`` request for the life of the worker.
_REPORT_CACHE: dict[str, list[dict[str, object]]] = {}

_REPORT_SEQUENCE = itertools.count()


def health() -> dict[str, object]:
    """Return the liveness payload of ``/health``: the worker's pid, nothing allocated to keep."""
    return {"status": "ok", "pid": os.getpid()}


def build_items(n: int) -> bytes:
    """Build ``n`` item records, serialize them to JSON and drop them (``/items``).

    The records exist only during the call: the memory is transient.
    ``n`` is clamped to ``0..MAX_ITEMS``. Returns the UTF-8 JSON body, about
    60 bytes per item.
    """
    n = max(0, min(n, MAX_ITEMS))
    items = []
    for index in range(n):
        items.append({"id": index, "name": f"item-{index:06d}", "price_cents": index * 7 % 10_000})
    body = json.dumps({"count": n, "items": items}).encode()
    del items
    return body


def render_report(customer: str) -> dict[str, object]:
    """Build a customer report and cache it forever (``/report``): THE LEAK.

    Builds :data:`REPORT_ROWS` row dicts of fresh strings (about 900 KiB of
    Python objects) and stores them in the unbounded ``_REPORT_CACHE`` under
    a key that is unique per call, so nothing is ever reused or evicted.
    Returns a small summary of the report.
    """
    key = f"{customer}:{next(_REPORT_SEQUENCE)}"
    rows = []
    for line in range(REPORT_ROWS):
        note = f"{customer}/{line:04d}/".ljust(REPORT_NOTE_CHARS, "#")
        rows.append({"customer": customer, "line": line, "sku": f"SKU-{line:05d}-{customer}", "note": note})
    _REPORT_CACHE[key] = rows
    return {"customer": customer, "key": key, "rows": len(rows), "cached_reports": len(_REPORT_CACHE)}


class ServiceHandler(BaseHTTPRequestHandler):
    """HTTP/1.0 handler dispatching the three endpoints; one request per connection."""

    #: Socket timeout for a client connection, in seconds, so a stuck client
    #: cannot hold a worker forever.
    timeout = 10

    server_version = "prefork-demo/1"

    def do_GET(self) -> None:  # noqa: N802 (name fixed by BaseHTTPRequestHandler)
        """Route a GET request by path; unknown paths get 404."""
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path == "/health":
            self._send_json(HTTPStatus.OK, json.dumps(health()).encode())
        elif url.path == "/items":
            self._send_json(HTTPStatus.OK, build_items(_int_param(query, "n", 100)))
        elif url.path == "/report":
            customer = query.get("customer", ["anonymous"])[0][:64]
            summary = render_report(customer)
            summary["pid"] = os.getpid()
            self._send_json(HTTPStatus.OK, json.dumps(summary).encode())
        else:
            self._send_json(HTTPStatus.NOT_FOUND, b'{"error": "not found"}')

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (signature fixed by the base class)
        """Silence the per-request access log: the load generator sends hundreds per second."""

    def _send_json(self, status: HTTPStatus, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _int_param(query: dict[str, list[str]], name: str, default: int) -> int:
    """Return query parameter ``name`` as an int, or ``default`` when absent or malformed."""
    try:
        return int(query[name][0])
    except (KeyError, IndexError, ValueError):
        return default
