"""Pre-fork HTTP server: a master binds one socket on 127.0.0.1, forks N workers that share it.

Process model (the one gunicorn and uWSGI use):

* the master binds and listens on one TCP socket, then ``os.fork()``s the
  workers; it serves no requests itself, only waits for its workers, stops
  them on SIGTERM/SIGINT, and stops by itself after ``--max-seconds``;
* each worker runs a ``socketserver`` loop (``app.ServiceHandler``) on the
  inherited socket. The kernel hands each connection to whichever worker
  accepts first, so the leaking ``/report`` requests land on workers in an
  OS-chosen order.

Every worker also stops by itself: at the master's deadline, on SIGTERM or
SIGINT, or when its master is gone. Each process prints one JSON line when it
starts or stops, with its pid and resident set size (RSS), so a run can be
checked without a tracer.

Run standalone::

    python server.py --workers 4 --port 8000 --max-seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import socketserver
import sys
import time
import traceback
from typing import Callable

import app

#: The only address the service binds: it is a local demo.
HOST = "127.0.0.1"

#: How long a worker's accept loop blocks before re-checking its stop
#: conditions, in seconds.
WORKER_POLL_SECONDS = 0.25

#: How often the master checks its workers and stop conditions, in seconds.
MASTER_POLL_SECONDS = 0.1

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Return this process's resident set size in bytes, from ``/proc/self/statm`` (field 2, in pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES


def emit(event: str, **fields: object) -> None:
    """Print one JSON line ``{"event": event, ...fields}`` to stdout and flush it.

    One ``write`` per line (not ``print``, which writes the newline separately
    when stdout is unbuffered); lines are well under PIPE_BUF, so lines of
    concurrent processes sharing the pipe do not interleave.
    """
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


class PreforkServer:
    """The master: owns the listening socket and the worker processes.

    Use ``start()``, then ``supervise()`` until a stop condition, then ``stop()``.
    """

    def __init__(self, port: int = 0, workers: int = 4, max_seconds: float = 600.0) -> None:
        """Configure a server on ``127.0.0.1:port`` (0: the OS picks a free port).

        ``workers`` is the number of forked workers (>= 1); ``max_seconds`` bounds
        the life of the master and every worker, counted from ``start()``.
        """
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.port = port
        self.workers = workers
        self.max_seconds = max_seconds
        self.worker_pids: dict[int, int] = {}
        self._socket: socket.socket | None = None
        self._deadline = 0.0
        self._stop_signal: int | None = None

    def start(self) -> int:
        """Bind and listen, fork the workers, install the master's signal handlers.

        Returns the bound port. Prints a ``started`` JSON line with the master
        pid, port and worker pids by index.
        """
        self._deadline = time.monotonic() + self.max_seconds
        self._socket = socket.create_server((HOST, self.port), backlog=256)
        # Non-blocking: when several workers wake for one connection, the
        # losers' accept() fails with EAGAIN instead of blocking.
        self._socket.setblocking(False)
        self.port = self._socket.getsockname()[1]
        for index in range(self.workers):
            self.worker_pids[index] = self._fork_worker(index)
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        emit("started", role="master", pid=os.getpid(), port=self.port,
             workers={str(i): pid for i, pid in self.worker_pids.items()}, rss_bytes=rss_bytes())
        return self.port

    def supervise(self, done: Callable[[], bool] = lambda: False) -> str:
        """Wait for workers until ``done()`` is true, a stop signal, the deadline, or no live workers.

        Reaps workers that exit on their own. Returns why it stopped:
        ``"done"``, ``"signal"``, ``"deadline"`` or ``"no-workers"``.
        """
        while True:
            self._reap(block=False)
            if self._stop_signal is not None:
                return "signal"
            if done():
                return "done"
            if time.monotonic() >= self._deadline:
                return "deadline"
            if not self.worker_pids:
                return "no-workers"
            time.sleep(MASTER_POLL_SECONDS)

    def stop(self, grace_seconds: float = 5.0) -> None:
        """Send SIGTERM to live workers, wait up to ``grace_seconds``, SIGKILL the rest, close the socket."""
        for pid in self.worker_pids.values():
            _signal_quietly(pid, signal.SIGTERM)
        give_up = time.monotonic() + grace_seconds
        while self.worker_pids and time.monotonic() < give_up:
            self._reap(block=False)
            time.sleep(MASTER_POLL_SECONDS)
        for pid in self.worker_pids.values():
            _signal_quietly(pid, signal.SIGKILL)
        self._reap(block=True)
        if self._socket is not None:
            self._socket.close()
        emit("stopped", role="master", pid=os.getpid(), rss_bytes=rss_bytes())

    def _fork_worker(self, index: int) -> int:
        """Fork worker ``index``; in the child run the worker loop and never return."""
        assert self._socket is not None
        master_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            exit_code = 1
            try:
                _run_worker(self._socket, index, master_pid, self._deadline)
                exit_code = 0
            except BaseException:  # noqa: BLE001 (the child must never return into the master's code)
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                os._exit(exit_code)
        return pid

    def _reap(self, block: bool) -> None:
        """Collect exited workers: all of them if ``block``, else only those already gone."""
        for index, pid in list(self.worker_pids.items()):
            try:
                done_pid, _status = os.waitpid(pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                done_pid = pid
            if done_pid == pid:
                del self.worker_pids[index]

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        self._stop_signal = signum


def _run_worker(listener: socket.socket, index: int, master_pid: int, deadline: float) -> None:
    """Serve requests on the inherited ``listener`` until a stop signal, the deadline, or the master is gone."""
    stop_signal: list[int] = []

    def on_stop(signum: int, _frame: object) -> None:
        stop_signal.append(signum)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    server = socketserver.TCPServer((HOST, 0), app.ServiceHandler, bind_and_activate=False)
    server.socket.close()
    server.socket = listener
    server.server_address = listener.getsockname()
    server.timeout = WORKER_POLL_SECONDS
    emit("started", role="worker", index=index, pid=os.getpid(), rss_bytes=rss_bytes())
    while not stop_signal and time.monotonic() < deadline and os.getppid() == master_pid:
        server.handle_request()
    emit("stopped", role="worker", index=index, pid=os.getpid(), rss_bytes=rss_bytes(),
         cached_reports=len(app._REPORT_CACHE))


def _signal_quietly(pid: int, signum: int) -> None:
    """Send ``signum`` to ``pid``, ignoring a process that is already gone."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the standalone server's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000,
                        help="TCP port on 127.0.0.1; 0 lets the OS pick (default 8000)")
    parser.add_argument("--workers", type=int, default=4, help="number of forked workers (default 4)")
    parser.add_argument("--max-seconds", type=float, default=300.0,
                        help="the master and its workers stop after this many seconds (default 300)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the server until SIGTERM/SIGINT or ``--max-seconds``; return the exit code."""
    args = parse_args(argv)
    server = PreforkServer(port=args.port, workers=args.workers, max_seconds=args.max_seconds)
    server.start()
    reason = server.supervise()
    server.stop()
    emit("exit", role="master", pid=os.getpid(), reason=reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
