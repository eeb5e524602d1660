"""Dump CPython 3.11+ location tables as fixtures for memtrace's linetable tests.

Run with each interpreter whose fixture you want to (re)generate, e.g.
    ~/.pyenv/versions/3.12.1/bin/python3.12 gen_linetables.py > linetables-3.12.json

For every code object compiled from SAMPLE (and, recursively, its nested code
objects) it writes `co_linetable` (hex), `co_firstlineno` and, for every code
unit index, the line `co_positions()` reports (null when there is none). The
Rust test decodes each table and must reproduce every line exactly.
"""
import json
import sys
import textwrap

SAMPLE = '''
import os

def simple(a, b):
    return a + b

def branches(x):
    if x > 10:
        y = [i * i for i in range(x)]
    elif x < -10:
        y = {i: str(i) for i in range(-x)}
    else:
        y = None
    while x > 0:
        x -= 1
        if x == 5:
            break
    try:
        z = 1 / x
    except ZeroDivisionError:
        z = 0
    finally:
        pass
    return y, z

def multiline_call(a):
    return os.path.join(
        "a",
        str(a),
        "c",
    )

async def coro(n):
    for i in range(n):
        yield i

def gen(n):
    total = 0
    for i in range(n):
        total += yield i
    return total

class Klass:
    attr = 1

    def method(self, v):
        def inner(w):
            return lambda q: q + w + v
        return inner(v)(self.attr)

def far_lines():
    a = 1
''' + '\n' * 300 + '''
    b = 2
''' + '\n' * 5000 + '''
    return a + b

def backwards(n):
    return [
        x
        for x in range(n)
        if x
    ]
'''


def walk(code):
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            yield from walk(const)


def dump(code):
    lines = [pos[0] for pos in code.co_positions()]
    return {
        "qualname": code.co_qualname,
        "firstlineno": code.co_firstlineno,
        "linetable": code.co_linetable.hex(),
        "lines": lines,
    }


def main():
    codes = [compile(SAMPLE, "sample.py", "exec"),
             compile(open(textwrap.__file__).read(), "textwrap.py", "exec")]
    out = {
        "version": "%d.%d.%d" % sys.version_info[:3],
        "codes": [dump(c) for root in codes for c in walk(root)],
    }
    json.dump(out, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


main()
