"""Dump CPython 3.9/3.10 line tables as fixtures for memtrace's lnotab tests.

Run with the interpreter whose fixture you want to (re)generate, e.g.
    ~/.pyenv/versions/3.10.13/bin/python3.10 gen_lnotabs.py > lnotabs-3.10.json

For every code object compiled from gen_linetables.py's SAMPLE (and
textwrap.py), recursively, it writes `co_lnotab` (3.9) or `co_linetable`
(3.10) in hex, `co_firstlineno` and, for every instruction i, the line that
CPython's own C function `PyCode_Addr2Line(code, 2 * i)` returns (null for -1:
no line). The Rust test decodes each table and must reproduce every line.
"""
import ctypes
import json
import os
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = {}
with open(os.path.join(HERE, "gen_linetables.py")) as f:
    source = f.read()
# SAMPLE is built by the first statement that assigns it; run only that part.
exec(source[source.index("SAMPLE = "):source.index("def walk(")], SAMPLE)

ADDR2LINE = ctypes.pythonapi.PyCode_Addr2Line
ADDR2LINE.argtypes = [ctypes.py_object, ctypes.c_int]
ADDR2LINE.restype = ctypes.c_int


def walk(code):
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            yield from walk(const)


def dump(code):
    table = code.co_linetable if sys.version_info >= (3, 10) else code.co_lnotab
    lines = []
    for index in range(len(code.co_code) // 2):
        line = ADDR2LINE(code, 2 * index)
        lines.append(None if line < 0 else line)
    return {
        "qualname": code.co_name,
        "firstlineno": code.co_firstlineno,
        "table": table.hex(),
        "lines": lines,
    }


def main():
    codes = [compile(SAMPLE["SAMPLE"], "sample.py", "exec"),
             compile(open(textwrap.__file__).read(), "textwrap.py", "exec")]
    out = {
        "version": "%d.%d.%d" % sys.version_info[:3],
        "codes": [dump(c) for root in codes for c in walk(root)],
    }
    json.dump(out, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


main()
