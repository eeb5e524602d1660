/* Test program of mixed Python + native stacks: a host that embeds CPython.
 *
 * It registers a built-in module `host` (PyImport_AppendInittab) whose
 * `fill_cache(bytes)` calls the host's own `host_fill_cache`, which mallocs
 * and touches `bytes` and keeps the block until exit. The embedded script
 * waits `argv[1]` seconds (memtrace attaches the allocator probes once it
 * finds the interpreter), then `warm_cache` calls `host.fill_cache` for
 * `argv[2]` MiB and prints
 *   {"event": "filled", "pid": ..., "function": "warm_cache", "malloc_bytes": ...}
 *
 * Built by tests/native_stacks.rs with gcc -O2 against pyenv's libpython3.11
 * (`python3.11-config --cflags --ldflags --embed`, plus an rpath): no frame
 * pointers, so unwinding goes through its .eh_frame.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Blocks kept until exit. */
static void *kept[64];
static size_t kept_count;

/* Mallocs and touches `bytes`; keeps the block. Not static, not inlined: a
 * frame of its own that memtrace must name. */
__attribute__((noinline)) void *host_fill_cache(size_t bytes) {
    unsigned char *block = malloc(bytes);
    if (block != NULL) {
        memset(block, 0x5a, bytes);
        kept[kept_count++ % 64] = block;
    }
    return block;
}

static PyObject *host_fill(PyObject *self, PyObject *args) {
    unsigned long long bytes;
    (void)self;
    if (!PyArg_ParseTuple(args, "K", &bytes)) {
        return NULL;
    }
    if (host_fill_cache((size_t)bytes) == NULL) {
        return PyErr_NoMemory();
    }
    return PyLong_FromUnsignedLongLong(bytes);
}

static PyMethodDef host_methods[] = {
    {"fill_cache", host_fill, METH_VARARGS, "Malloc and keep `bytes` in the host."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef host_module = {
    PyModuleDef_HEAD_INIT, "host", NULL, -1, host_methods, NULL, NULL, NULL, NULL,
};

static PyObject *init_host(void) { return PyModule_Create(&host_module); }

static const char SCRIPT[] =
    "import host, json, os, time\n"
    "time.sleep(%s)\n"
    "def warm_cache(mib):\n"
    "    return host.fill_cache(mib << 20)\n"
    "filled = warm_cache(%s)\n"
    "print(json.dumps({'event': 'filled', 'pid': os.getpid(), 'function': 'warm_cache',\n"
    "                  'malloc_bytes': filled}), flush=True)\n";

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DELAY_SECONDS MIB\n", argv[0]);
        return 2;
    }
    char script[1024];
    snprintf(script, sizeof script, SCRIPT, argv[1], argv[2]);
    if (PyImport_AppendInittab("host", init_host) != 0) {
        return 1;
    }
    Py_Initialize();
    int failed = PyRun_SimpleString(script);
    if (Py_FinalizeEx() < 0) {
        return 1;
    }
    return failed ? 1 : 0;
}
