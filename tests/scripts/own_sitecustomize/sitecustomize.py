"""A program's own ``sitecustomize``: says that it ran, and which allocator the process has.

Used by tests/allocations.rs: under ``memtrace run --allocations`` memtrace's
``sitecustomize`` comes first on ``sys.path`` and must still import this one.

Output: one JSON line ``{"event": "own_sitecustomize", "pid": ..., "pythonmalloc": ...}``.
"""

import json
import os
import sys

sys.stdout.write(json.dumps({
    "event": "own_sitecustomize",
    "pid": os.getpid(),
    "pythonmalloc": os.environ.get("PYTHONMALLOC"),
}) + "\n")
sys.stdout.flush()
