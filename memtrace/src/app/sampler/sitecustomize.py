"""memtrace's allocation sampler: installed before the program's first line.

memtrace (``run --allocations``) put this file's folder first on PYTHONPATH
and the sampler library in LD_PRELOAD. This installs the sampler's wrappers
on CPython's three allocator domains, then imports the program's own
``sitecustomize`` (the next one on ``sys.path``), if there is one.
"""

import os
import sys


def _memtrace_install_sampler():
    import ctypes

    path = os.environ.get("MEMTRACE_SAMPLER_LIB")
    if not path:
        return
    try:
        ctypes.CDLL(path).memtrace_sampler_install()
    except OSError as err:
        sys.stderr.write("memtrace: cannot load the allocation sampler %s: %s\n" % (path, err))


def _memtrace_chain_sitecustomize():
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None:
        return
    module = module_from_spec(spec)
    # The import of this module ends by taking sys.modules["sitecustomize"]:
    # the program's own from here on.
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_memtrace_install_sampler()
_memtrace_chain_sitecustomize()
