"""memtrace demo: run the pre-fork service under a bounded load, then stop it cleanly.

This process IS the service's master, so ``memtrace run -- python run_demo.py``
traces the master and its forked workers as one process tree:

1. bind 127.0.0.1 (an OS-chosen port by default) and fork ``--workers`` workers
   (``server.PreforkServer``);
2. start the load generator as a separate child process,
   ``python loadgen.py --port P ...``: its own memory stays out of the
   master's and the workers' numbers, and its command line says what it is;
3. supervise the workers while the load runs (``--seconds``), then keep the
   service up but idle for ``--idle-seconds`` (memory that stays is retained,
   not transient);
4. stop the workers (SIGTERM, then SIGKILL after a grace period) and exit 0
   when the load ran without errors.

What memtrace should find: the workers that served ``/report`` grow by about
900 KiB per ``/report`` request, all of it under ``render_report`` in
``app.py`` (the unbounded ``_REPORT_CACHE``); ``/items`` memory is transient;
the master and the load generator stay flat.

Run::

    python run_demo.py --workers 4 --seconds 15 --rps 60
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from server import PreforkServer, emit

LOADGEN = Path(__file__).resolve().with_name("loadgen.py")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the demo's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="number of forked workers (default 4)")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds of load (default 15)")
    parser.add_argument("--rps", type=float, default=60.0, help="requests per second of the load (default 60)")
    parser.add_argument("--idle-seconds", type=float, default=2.0,
                        help="seconds the service stays up without load after the load ends (default 2)")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1; 0 lets the OS pick (default 0)")
    return parser.parse_args(argv)


def _finish(child: subprocess.Popen[bytes]) -> int:
    """Return the exit code of ``child``, stopping it first (SIGTERM, then SIGKILL after 10 s) if it still runs."""
    if child.poll() is None:
        child.terminate()
    try:
        return child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def main(argv: list[str] | None = None) -> int:
    """Run the demo end to end; return 0 when the load ran without errors."""
    args = parse_args(argv)
    # Every phase is bounded: the master's own deadline covers load, idle
    # time and a margin, in case the load generator hangs.
    max_seconds = args.seconds + args.idle_seconds + 30.0
    server = PreforkServer(port=args.port, workers=args.workers, max_seconds=max_seconds)
    port = server.start()
    loadgen = subprocess.Popen([sys.executable, str(LOADGEN), "--port", str(port),
                                "--seconds", str(args.seconds), "--rps", str(args.rps)])
    emit("loadgen_started", role="master", pid=os.getpid(), loadgen_pid=loadgen.pid)
    reason = server.supervise(done=lambda: loadgen.poll() is not None)
    loadgen_code = _finish(loadgen)
    if reason == "done" and args.idle_seconds > 0:
        idle_until = time.monotonic() + args.idle_seconds
        reason = server.supervise(done=lambda: time.monotonic() >= idle_until)
    server.stop()
    emit("exit", role="master", pid=os.getpid(), reason=reason, loadgen_exit_code=loadgen_code)
    return 0 if reason == "done" and loadgen_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
