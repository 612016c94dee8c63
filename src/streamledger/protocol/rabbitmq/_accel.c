/*
 * Optional C accelerator for the two per-record loops of the chunk decoder.
 *
 * Measured on the shared 2-core machine (bench/decode.py, CPU seconds): the pure-Python loop that
 * walks variable-size entries costs ~0.4 us per record and the lone-data-section check ~0.15 us,
 * together most of a raw or AMQP read. Both loops are here, with exactly the semantics and error
 * messages of their pure-Python twins in chunk.py / amqp.py (_split_entries_py, _data_bodies_py),
 * which are used whenever this module is not built; tests run both and compare them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/*
 * split_entries(data: bytes, plain: bool) -> list[bytes] | None
 *
 * plain=False: a chunk data section; returns None as soon as an entry is a sub-batch (top bit).
 * plain=True: a sub-batch record list; sizes are plain uint32.
 * ValueError (same text as the Python version) when an entry header or body runs past the end.
 */
static PyObject *split_entries(PyObject *self, PyObject *args)
{
    Py_buffer view;
    int plain;
    if (!PyArg_ParseTuple(args, "y*p", &view, &plain))
        return NULL;
    const unsigned char *d = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len, p = 0, count = 0;
    /* pass 1: validate and count, so the list is allocated once with its final size */
    while (p < n) {
        if (n - p < 4) {
            PyBuffer_Release(&view);
            return PyErr_Format(PyExc_ValueError, "entry header at data byte %zd is truncated", p);
        }
        uint32_t w = be32(d + p);
        if (!plain && (w & 0x80000000u)) {
            PyBuffer_Release(&view);
            Py_RETURN_NONE;
        }
        p += 4;
        if ((Py_ssize_t)w > n - p) {
            Py_ssize_t over = p + (Py_ssize_t)w - n;
            PyBuffer_Release(&view);
            return PyErr_Format(PyExc_ValueError, "last entry runs %zd bytes past the data section", over);
        }
        p += (Py_ssize_t)w;
        count++;
    }
    PyObject *out = PyList_New(count);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    p = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint32_t w = be32(d + p);
        p += 4;
        PyObject *rec = PyBytes_FromStringAndSize((const char *)d + p, (Py_ssize_t)w);
        if (rec == NULL) {
            Py_DECREF(out);
            PyBuffer_Release(&view);
            return NULL;
        }
        PyList_SET_ITEM(out, i, rec);
        p += (Py_ssize_t)w;
    }
    PyBuffer_Release(&view);
    return out;
}

/*
 * data_bodies(records: list[bytes]) -> tuple[list[bytes | None], int]
 *
 * For each record that is exactly one AMQP data section (00 53 75 a0 <len8> or 00 53 75 b0
 * <len32>, the length covering the rest of the record) its body, else None; plus the number of
 * Nones, so the caller knows at once whether any record needs the general decoder.
 */
static PyObject *data_bodies(PyObject *self, PyObject *arg)
{
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "data_bodies expects a list of bytes");
        return NULL;
    }
    Py_ssize_t m = PyList_GET_SIZE(arg), misses = 0;
    PyObject *out = PyList_New(m);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *r = PyList_GET_ITEM(arg, i);
        if (!PyBytes_Check(r)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_TypeError, "data_bodies expects a list of bytes");
            return NULL;
        }
        const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(r);
        Py_ssize_t len = PyBytes_GET_SIZE(r);
        PyObject *body = NULL;
        if (len >= 5 && s[0] == 0x00 && s[1] == 0x53 && s[2] == 0x75) {
            if (s[3] == 0xa0 && (Py_ssize_t)s[4] + 5 == len)
                body = PyBytes_FromStringAndSize((const char *)s + 5, len - 5);
            else if (s[3] == 0xb0 && len >= 9 && (Py_ssize_t)be32(s + 4) + 9 == len)
                body = PyBytes_FromStringAndSize((const char *)s + 9, len - 9);
            else
                goto miss;
            if (body == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            PyList_SET_ITEM(out, i, body);
            continue;
        }
    miss:
        Py_INCREF(Py_None);
        PyList_SET_ITEM(out, i, Py_None);
        misses++;
    }
    return Py_BuildValue("(Nn)", out, misses);
}

static PyMethodDef methods[] = {
    {"split_entries", split_entries, METH_VARARGS, "Records of a data section or sub-batch (see chunk.py)."},
    {"data_bodies", data_bodies, METH_O, "Bodies of lone-data-section AMQP records (see amqp.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_accel", "Optional C loops of the RabbitMQ Streams chunk decoder.", -1, methods,
};

PyMODINIT_FUNC PyInit__accel(void)
{
    return PyModule_Create(&module);
}
