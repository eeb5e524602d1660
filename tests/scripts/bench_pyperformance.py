"""Benchmark workload: one pyperformance benchmark, run in this process from pyperformance's own source.

pyperformance ships each benchmark as ``data-files/benchmarks/bm_<name>/run_benchmark.py``,
whose ``__main__`` block builds its inputs and hands the benchmark function to a
``pyperf.Runner`` (``bench_func`` or ``bench_time_func``), which would spawn worker
processes. This adapter loads that file unchanged with :func:`runpy.run_path`
(``run_name="__main__"``) while ``pyperf.Runner`` is replaced by :class:`CapturingRunner`,
which records the benchmark function and its arguments instead of running them.
It then calls the function ``--loops`` times in this one process (no pyperf
workers, no warm-up runs), so a tracer started with the interpreter sees every call.

Needs ``pyperformance`` and ``pyperf`` importable (the bench virtualenv has both).

Output: one JSON line ``{"event": "timed", "pid": ..., "phase_seconds": ...,
"benchmark": ..., "loops": ..., "rss_growth_bytes": ...}``; ``phase_seconds`` times the
benchmark loops only (``time.perf_counter``), not loading the benchmark module
or building its inputs.

Run::

    python bench_pyperformance.py --benchmark json_loads --loops 2000
"""

from __future__ import annotations

import argparse
import runpy
import sys
import time
from pathlib import Path
from typing import Any, Callable

from workload_common import emit, rss_bytes


class CapturingRunner:
    """Stand-in for ``pyperf.Runner``: records the benchmark a ``run_benchmark.py`` registers.

    Supports what pyperformance's benchmark scripts use of the runner: ``metadata``,
    ``argparser`` with ``parse_args`` (parsed from no arguments, so every benchmark
    option keeps its default), ``bench_func`` and ``bench_time_func``.
    """

    #: The last instance created, read back after the script has run.
    last: CapturingRunner | None = None

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        self.metadata: dict[str, Any] = {}
        self.argparser = argparse.ArgumentParser()
        self.call: Callable[[int], None] | None = None
        CapturingRunner.last = self

    def parse_args(self, _args: list[str] | None = None) -> argparse.Namespace:
        """Parse no arguments: each benchmark option keeps its default."""
        return self.argparser.parse_args([])

    def bench_func(self, _name: str, func: Callable[..., Any], *args: Any, **_kwargs: Any) -> None:
        """Record ``func(*args)``; a loop count of ``n`` calls it ``n`` times."""
        def call(loops: int) -> None:
            for _ in range(loops):
                func(*args)
        self.call = call

    def bench_time_func(self, _name: str, time_func: Callable[..., Any], *args: Any,
                        **_kwargs: Any) -> None:
        """Record ``time_func(loops, *args)``, which loops by itself (its own timing is ignored)."""
        self.call = lambda loops: time_func(loops, *args)

    def bench_async_func(self, *_args: Any, **_kwargs: Any) -> None:
        """Not supported: the chosen benchmarks are synchronous."""
        raise NotImplementedError("bench_async_func benchmarks are not supported")

    def bench_command(self, *_args: Any, **_kwargs: Any) -> None:
        """Not supported: command benchmarks time other processes."""
        raise NotImplementedError("bench_command benchmarks are not supported")


def benchmark_script(name: str) -> Path:
    """Return the ``run_benchmark.py`` of pyperformance benchmark ``name``, from the installed package."""
    import pyperformance

    path = Path(pyperformance.__file__).parent / "data-files" / "benchmarks" / f"bm_{name}" / "run_benchmark.py"
    if not path.is_file():
        raise SystemExit(f"no pyperformance benchmark {name!r}: {path} does not exist")
    return path


def load_benchmark(name: str) -> Callable[[int], None]:
    """Run benchmark ``name``'s script with a :class:`CapturingRunner`; return its loop function."""
    import pyperf

    path = benchmark_script(name)
    real_runner = pyperf.Runner
    pyperf.Runner = CapturingRunner
    saved_path = list(sys.path)
    sys.path.insert(0, str(path.parent))
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        pyperf.Runner = real_runner
        sys.path[:] = saved_path
    runner = CapturingRunner.last
    if runner is None or runner.call is None:
        raise SystemExit(f"{path} registered no benchmark with pyperf.Runner")
    return runner.call


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the workload's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", required=True, help="pyperformance benchmark name, e.g. json_loads")
    parser.add_argument("--loops", type=int, default=1, help="benchmark calls to time (default 1)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Load the benchmark, time ``--loops`` calls of it and print the JSON line; exit 0."""
    args = parse_args(argv)
    run_loops = load_benchmark(args.benchmark)
    rss_before = rss_bytes()
    started = time.perf_counter()
    run_loops(args.loops)
    phase_seconds = time.perf_counter() - started
    emit("timed", phase_seconds=round(phase_seconds, 6), benchmark=args.benchmark, loops=args.loops,
         rss_growth_bytes=rss_bytes() - rss_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
