/*
 * Optional C accelerator for the per-record loops of the chunk and AMQP decoders.
 *
 * Measured on the shared 2-core machine (bench/decode.py, CPU seconds): the pure-Python loop that
 * walks variable-size entries costs ~0.4 us per record and the lone-data-section check ~0.15 us,
 * together most of a raw or AMQP read; a message with properties and application-properties
 * costs ~10 us in the pure-Python section walker. Those three loops are here, with exactly the
 * results (and, for split_entries, the error messages) of their pure-Python twins in chunk.py /
 * amqp.py (_split_entries_py, _data_bodies_py, _decode_one), which are used whenever this module
 * is not built; tests run both and compare them. append_bodies / append_list (issue 11) write
 * the buffer layout of records.BufferBatch (twins _append_bodies_py / _append_list_py).
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
            else if (s[3] == 0xb0 && len >= 8 && (Py_ssize_t)be32(s + 4) + 8 == len)
                body = PyBytes_FromStringAndSize((const char *)s + 8, len - 8);
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

/*
 * split_bodies(data: bytes) -> tuple[list[bytes], list[int]] | None
 *
 * split_entries(data, False) and data_bodies() in one pass, without building the records that are
 * a lone data section: item i is the body of record i, or the whole record when it is another
 * shape (its index is then in the second list, for the general decoder). None at a sub-batch.
 */
static PyObject *split_bodies(PyObject *self, PyObject *args)
{
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view))
        return NULL;
    const unsigned char *d = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len, p = 0, count = 0;
    while (p < n) {
        if (n - p < 4) {
            PyBuffer_Release(&view);
            return PyErr_Format(PyExc_ValueError, "entry header at data byte %zd is truncated", p);
        }
        uint32_t w = be32(d + p);
        if (w & 0x80000000u) {
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
    PyObject *items = PyList_New(count);
    PyObject *misses = PyList_New(0);
    if (items == NULL || misses == NULL)
        goto fail;
    p = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t len = (Py_ssize_t)be32(d + p);
        const unsigned char *s = d + p + 4;
        p += 4 + len;
        PyObject *item;
        if (len >= 5 && s[0] == 0x00 && s[1] == 0x53 && s[2] == 0x75 && s[3] == 0xa0 && (Py_ssize_t)s[4] + 5 == len) {
            item = PyBytes_FromStringAndSize((const char *)s + 5, len - 5);
        } else if (len >= 8 && s[0] == 0x00 && s[1] == 0x53 && s[2] == 0x75 && s[3] == 0xb0
                   && (Py_ssize_t)be32(s + 4) + 8 == len) {
            item = PyBytes_FromStringAndSize((const char *)s + 8, len - 8);
        } else {
            item = PyBytes_FromStringAndSize((const char *)s, len);
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || PyList_Append(misses, index) < 0) {
                Py_XDECREF(index);
                Py_XDECREF(item);
                goto fail;
            }
            Py_DECREF(index);
        }
        if (item == NULL)
            goto fail;
        PyList_SET_ITEM(items, i, item);
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NN)", items, misses);
fail:
    Py_XDECREF(items);
    Py_XDECREF(misses);
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * The buffer layout (docs/interfaces.md, "Record buffers"): bodies appended to one bytearray, their
 * int32 end positions (native byte order) to another that starts with a 0, so that the pair is an
 * Arrow binary column's data and offsets buffers as they are. No per-record Python object.
 * ---------------------------------------------------------------------------------------- */

#define BODY_LIMIT ((Py_ssize_t)INT32_MAX)

/* the current length of the data buffer, after checking the offsets buffer ends there */
static int buffers_tail(PyObject *out_data, PyObject *out_offsets, Py_ssize_t *dlen, Py_ssize_t *olen)
{
    if (!PyByteArray_Check(out_data) || !PyByteArray_Check(out_offsets)) {
        PyErr_SetString(PyExc_TypeError, "the body buffers must be two bytearrays");
        return -1;
    }
    *dlen = PyByteArray_GET_SIZE(out_data);
    *olen = PyByteArray_GET_SIZE(out_offsets);
    int32_t last;
    if (*olen < 4 || *olen % 4 != 0) {
        PyErr_SetString(PyExc_ValueError, "the body offsets buffer must hold whole int32s, starting with 0");
        return -1;
    }
    memcpy(&last, PyByteArray_AS_STRING(out_offsets) + *olen - 4, 4);
    if ((Py_ssize_t)last != *dlen) {
        PyErr_Format(PyExc_ValueError, "the body offsets buffer ends at %d, the data buffer holds %zd bytes",
                     (int)last, *dlen);
        return -1;
    }
    return 0;
}

static int check_room(Py_ssize_t have, Py_ssize_t more)
{
    if (more > BODY_LIMIT - have) {
        PyErr_Format(PyExc_ValueError,
                     "%zd more body bytes would take the batch past 2147483647 bytes (int32 offsets)", more);
        return -1;
    }
    return 0;
}

/* grow both buffers by `bytes` and `count` offsets; returns the write positions */
static int grow(PyObject *out_data, PyObject *out_offsets, Py_ssize_t dlen, Py_ssize_t olen, Py_ssize_t bytes,
                Py_ssize_t count, char **dst, char **odst)
{
    if (PyByteArray_Resize(out_data, dlen + bytes) < 0)
        return -1;
    if (PyByteArray_Resize(out_offsets, olen + 4 * count) < 0) {
        PyByteArray_Resize(out_data, dlen); /* shrinking cannot fail */
        return -1;
    }
    *dst = PyByteArray_AS_STRING(out_data) + dlen;
    *odst = PyByteArray_AS_STRING(out_offsets) + olen;
    return 0;
}

/* the body of an AMQP record that is exactly one data section, or NULL */
static inline const unsigned char *lone_data(const unsigned char *s, Py_ssize_t len, Py_ssize_t *blen)
{
    if (len >= 5 && s[0] == 0x00 && s[1] == 0x53 && s[2] == 0x75) {
        if (s[3] == 0xa0 && (Py_ssize_t)s[4] + 5 == len) {
            *blen = len - 5;
            return s + 5;
        }
        if (s[3] == 0xb0 && len >= 8 && (Py_ssize_t)be32(s + 4) + 8 == len) {
            *blen = len - 8;
            return s + 8;
        }
    }
    return NULL;
}

/*
 * append_bodies(data: bytes, n_entries: int, n_records: int, klo: int, khi: int, amqp: bool,
 *               out_data: bytearray, out_offsets: bytearray) -> bool
 *
 * Appends the bodies of records klo..khi-1 of a chunk data section made of simple entries: the
 * records as stored (amqp=False) or the bodies of lone data sections (amqp=True). False, with nothing
 * appended, when an entry is a sub-batch or (amqp) a record in range has another shape: the caller
 * then takes the general decoder. The whole section is validated first, with the texts of
 * _split_entries / _fused_bodies, and the counts are checked against the header's.
 */
static PyObject *append_bodies(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t n_entries, n_records, klo, khi;
    int amqp;
    PyObject *out_data, *out_offsets;
    if (!PyArg_ParseTuple(args, "y*nnnnpOO", &view, &n_entries, &n_records, &klo, &khi, &amqp, &out_data,
                          &out_offsets))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t dlen, olen;
    if (buffers_tail(out_data, out_offsets, &dlen, &olen) < 0)
        goto done;
    const unsigned char *d = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len, p = 0, count = 0, bytes = 0;
    int fits = 1;
    /* pass 1: validate the whole section, count, and size the records in range */
    while (p < n) {
        if (n - p < 4) {
            PyErr_Format(PyExc_ValueError, "entry header at data byte %zd is truncated", p);
            goto done;
        }
        uint32_t w = be32(d + p);
        if (w & 0x80000000u) {
            result = Py_NewRef(Py_False);
            goto done;
        }
        p += 4;
        if ((Py_ssize_t)w > n - p) {
            PyErr_Format(PyExc_ValueError, "last entry runs %zd bytes past the data section", p + (Py_ssize_t)w - n);
            goto done;
        }
        if (count >= klo && count < khi) {
            Py_ssize_t blen = (Py_ssize_t)w;
            if (amqp && lone_data(d + p, (Py_ssize_t)w, &blen) == NULL)
                fits = 0;
            bytes += blen;
        }
        p += (Py_ssize_t)w;
        count++;
    }
    if (count != n_records || count != n_entries) {
        PyErr_Format(PyExc_ValueError, "data section holds %zd simple entries, the header says %zd entries and "
                     "%zd records", count, n_entries, n_records);
        goto done;
    }
    if (klo < 0 || klo > khi || khi > count) {
        PyErr_Format(PyExc_ValueError, "record range %zd..%zd is outside the chunk's %zd records", klo, khi, count);
        goto done;
    }
    if (!fits) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    if (check_room(dlen, bytes) < 0)
        goto done;
    char *dst, *odst;
    if (grow(out_data, out_offsets, dlen, olen, bytes, khi - klo, &dst, &odst) < 0)
        goto done;
    /* pass 2: copy (the section is known to be well formed) */
    int32_t pos32 = (int32_t)dlen;
    p = 0;
    for (Py_ssize_t i = 0; i < khi; i++) {
        Py_ssize_t len = (Py_ssize_t)be32(d + p);
        const unsigned char *s = d + p + 4;
        p += 4 + len;
        if (i < klo)
            continue;
        Py_ssize_t blen = len;
        if (amqp)
            s = lone_data(s, len, &blen);
        memcpy(dst, s, (size_t)blen);
        dst += blen;
        pos32 += (int32_t)blen;
        memcpy(odst, &pos32, 4);
        odst += 4;
    }
    result = Py_NewRef(Py_True);
done:
    PyBuffer_Release(&view);
    return result;
}

/*
 * append_list(bodies: list[bytes], out_data: bytearray, out_offsets: bytearray) -> None
 *
 * The general decoder's bodies, appended in the same layout.
 */
static PyObject *append_list(PyObject *self, PyObject *args)
{
    PyObject *bodies, *out_data, *out_offsets;
    if (!PyArg_ParseTuple(args, "O!OO", &PyList_Type, &bodies, &out_data, &out_offsets))
        return NULL;
    Py_ssize_t dlen, olen, bytes = 0, m = PyList_GET_SIZE(bodies);
    if (buffers_tail(out_data, out_offsets, &dlen, &olen) < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *b = PyList_GET_ITEM(bodies, i);
        if (!PyBytes_Check(b)) {
            PyErr_SetString(PyExc_TypeError, "append_list expects a list of bytes");
            return NULL;
        }
        bytes += PyBytes_GET_SIZE(b);
        if (bytes > BODY_LIMIT)
            break;
    }
    if (check_room(dlen, bytes) < 0)
        return NULL;
    char *dst, *odst;
    if (grow(out_data, out_offsets, dlen, olen, bytes, m, &dst, &odst) < 0)
        return NULL;
    int32_t pos32 = (int32_t)dlen;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *b = PyList_GET_ITEM(bodies, i);
        Py_ssize_t blen = PyBytes_GET_SIZE(b);
        memcpy(dst, PyBytes_AS_STRING(b), (size_t)blen);
        dst += blen;
        pos32 += (int32_t)blen;
        memcpy(odst, &pos32, 4);
        odst += 4;
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------
 * decode_record(record: bytes) -> (body, properties, application_properties, message_annotations)
 *                                 | None
 *
 * The common message shapes (header, annotations, properties, application-properties, data
 * sections; simple value types) decoded in C. Anything else - an amqp-value or amqp-sequence
 * body, arrays, described values, decimals, chars, unknown sections, and every malformed input -
 * returns None, and the caller uses the pure-Python decoder (amqp._decode_one), which is the
 * reference: when this function returns a result it equals _decode_one's exactly (tests compare).
 * ---------------------------------------------------------------------------------------- */

static PyObject *Symbol_type = NULL;   /* amqp.Symbol */
static PyObject *ts_func = NULL;       /* amqp._ts(ms) -> datetime | int */
static PyObject *uuid_func = NULL;     /* bytes -> uuid.UUID */
static PyObject *property_names = NULL; /* tuple of 13 str */

#define UNSUPPORTED ((PyObject *)1) /* sentinel: not an error, hand over to Python */
#define MAX_DEPTH 32

typedef struct {
    const unsigned char *d;
    Py_ssize_t end;   /* the record's end */
} reader_t;

static PyObject *dec_value(reader_t *r, Py_ssize_t *pos, Py_ssize_t limit, int depth);

/* count items ending exactly at `stop`; returns a new list, NULL on error, UNSUPPORTED otherwise */
static PyObject *dec_items(reader_t *r, Py_ssize_t pos, Py_ssize_t count, Py_ssize_t stop, int depth)
{
    if (count > stop - pos)
        return UNSUPPORTED;
    PyObject *list = PyList_New(count);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *v = dec_value(r, &pos, stop, depth + 1);
        if (v == NULL || v == UNSUPPORTED) {
            Py_DECREF(list);
            return v;
        }
        PyList_SET_ITEM(list, i, v);
    }
    if (pos != stop) {
        Py_DECREF(list);
        return UNSUPPORTED;
    }
    return list;
}

static PyObject *list_to_dict(PyObject *items)
{
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (n & 1)
        return UNSUPPORTED;
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i += 2) {
        if (PyDict_SetItem(d, PyList_GET_ITEM(items, i), PyList_GET_ITEM(items, i + 1)) < 0) {
            Py_DECREF(d);
            if (PyErr_ExceptionMatches(PyExc_TypeError)) { /* unhashable key: Python decides */
                PyErr_Clear();
                return UNSUPPORTED;
            }
            return NULL;
        }
    }
    return d;
}

static PyObject *dec_value(reader_t *r, Py_ssize_t *pos, Py_ssize_t limit, int depth)
{
    const unsigned char *d = r->d;
    Py_ssize_t p = *pos;
    if (depth > MAX_DEPTH || p >= limit)
        return UNSUPPORTED;
    unsigned char c = d[p++];
    Py_ssize_t avail = limit - p;
    PyObject *v = NULL;
    switch (c) {
    case 0x40: v = Py_NewRef(Py_None); break;
    case 0x41: v = Py_NewRef(Py_True); break;
    case 0x42: v = Py_NewRef(Py_False); break;
    case 0x43: case 0x44: v = PyLong_FromLong(0); break;
    case 0x56:
        if (avail < 1 || d[p] > 1) return UNSUPPORTED;
        v = PyBool_FromLong(d[p]); p += 1; break;
    case 0x50: case 0x52: case 0x53:
        if (avail < 1) return UNSUPPORTED;
        v = PyLong_FromLong(d[p]); p += 1; break;
    case 0x51: case 0x54: case 0x55:
        if (avail < 1) return UNSUPPORTED;
        v = PyLong_FromLong((signed char)d[p]); p += 1; break;
    case 0x60:
        if (avail < 2) return UNSUPPORTED;
        v = PyLong_FromLong(((long)d[p] << 8) | d[p + 1]); p += 2; break;
    case 0x61:
        if (avail < 2) return UNSUPPORTED;
        v = PyLong_FromLong((int16_t)(((uint16_t)d[p] << 8) | d[p + 1])); p += 2; break;
    case 0x70:
        if (avail < 4) return UNSUPPORTED;
        v = PyLong_FromUnsignedLong(be32(d + p)); p += 4; break;
    case 0x71:
        if (avail < 4) return UNSUPPORTED;
        v = PyLong_FromLong((int32_t)be32(d + p)); p += 4; break;
    case 0x80: case 0x81: case 0x83: {
        if (avail < 8) return UNSUPPORTED;
        uint64_t u = ((uint64_t)be32(d + p) << 32) | be32(d + p + 4);
        p += 8;
        if (c == 0x80) {
            v = PyLong_FromUnsignedLongLong(u);
        } else if (c == 0x81) {
            v = PyLong_FromLongLong((int64_t)u);
        } else {
            PyObject *ms = PyLong_FromLongLong((int64_t)u);
            if (ms == NULL) return NULL;
            v = PyObject_CallOneArg(ts_func, ms);
            Py_DECREF(ms);
        }
        break;
    }
    case 0x72:
        if (avail < 4) return UNSUPPORTED;
        v = PyFloat_FromDouble(PyFloat_Unpack4((const char *)d + p, 0)); p += 4; break;
    case 0x82:
        if (avail < 8) return UNSUPPORTED;
        v = PyFloat_FromDouble(PyFloat_Unpack8((const char *)d + p, 0)); p += 8; break;
    case 0x98: {
        if (avail < 16) return UNSUPPORTED;
        PyObject *raw = PyBytes_FromStringAndSize((const char *)d + p, 16);
        if (raw == NULL) return NULL;
        v = PyObject_CallOneArg(uuid_func, raw);
        Py_DECREF(raw);
        p += 16;
        break;
    }
    case 0xa0: case 0xa1: case 0xa3: case 0xb0: case 0xb1: case 0xb3: {
        Py_ssize_t len;
        if (c & 0x10) {
            if (avail < 4) return UNSUPPORTED;
            len = (Py_ssize_t)be32(d + p); p += 4;
        } else {
            if (avail < 1) return UNSUPPORTED;
            len = d[p]; p += 1;
        }
        if (len > limit - p) return UNSUPPORTED;
        const char *s = (const char *)d + p;
        p += len;
        if ((c & 0x0f) == 0x00) {
            v = PyBytes_FromStringAndSize(s, len);
        } else if ((c & 0x0f) == 0x01) {
            v = PyUnicode_DecodeUTF8(s, len, "strict");
            if (v == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                return UNSUPPORTED;
            }
        } else {
            PyObject *text = PyUnicode_DecodeASCII(s, len, "strict");
            if (text == NULL) {
                if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                    PyErr_Clear();
                    return UNSUPPORTED;
                }
                return NULL;
            }
            v = PyObject_CallOneArg(Symbol_type, text);
            Py_DECREF(text);
        }
        break;
    }
    case 0x45: v = PyList_New(0); break;
    case 0xc0: case 0xc1: case 0xd0: case 0xd1: {
        Py_ssize_t size, count, start;
        if (c & 0x10) {
            if (avail < 8) return UNSUPPORTED;
            size = (Py_ssize_t)be32(d + p);
            count = (Py_ssize_t)be32(d + p + 4);
            start = p + 8;
            if (size < 4) return UNSUPPORTED;
            p += 4;
        } else {
            if (avail < 2) return UNSUPPORTED;
            size = d[p];
            count = d[p + 1];
            start = p + 2;
            if (size < 1) return UNSUPPORTED;
            p += 1;
        }
        Py_ssize_t stop = p + size;
        if (stop > limit) return UNSUPPORTED;
        PyObject *items = dec_items(r, start, count, stop, depth);
        if (items == NULL || items == UNSUPPORTED) return items;
        p = stop;
        if (c & 0x01) {
            v = list_to_dict(items);
            Py_DECREF(items);
            if (v == UNSUPPORTED) return v;
        } else {
            v = items;
        }
        break;
    }
    default:
        return UNSUPPORTED; /* decimals, char, arrays, described values: Python handles them */
    }
    if (v == NULL)
        return NULL;
    *pos = p;
    return v;
}

/* dict of the non-null fields of a properties list (names from amqp.PROPERTY_FIELDS) */
static PyObject *fields_dict(PyObject *list, PyObject *names)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (n > PyTuple_GET_SIZE(names))
        return UNSUPPORTED;
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(list, i);
        if (v != Py_None && PyDict_SetItem(out, PyTuple_GET_ITEM(names, i), v) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* annotations: symbol keys become plain str */
static PyObject *annotations_dict(PyObject *m)
{
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    Py_ssize_t i = 0;
    PyObject *k, *v;
    while (PyDict_Next(m, &i, &k, &v)) {
        PyObject *key = (PyObject_TypeCheck(k, (PyTypeObject *)Symbol_type)) ? PyObject_Str(k) : Py_NewRef(k);
        if (key == NULL || PyDict_SetItem(out, key, v) < 0) {
            Py_XDECREF(key);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(key);
    }
    return out;
}

static PyObject *decode_record(PyObject *self, PyObject *arg)
{
    if (Symbol_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_accel.configure() was not called");
        return NULL;
    }
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "decode_record expects bytes");
        return NULL;
    }
    reader_t r = {(const unsigned char *)PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg)};
    Py_ssize_t n = r.end, pos = 0;
    if (n < 3)
        Py_RETURN_NONE;
    PyObject *props = NULL, *app = NULL, *ma = NULL, *body = NULL, *value = NULL;
    PyObject *parts = NULL; /* several data sections */
    PyObject *result = NULL;
    int unsupported = 0;
    while (pos < n) {
        if (n - pos < 4 || r.d[pos] != 0x00 || r.d[pos + 1] != 0x53) {
            unsupported = 1;
            break;
        }
        unsigned char code = r.d[pos + 2];
        pos += 3;
        if (code < 0x70 || code > 0x78 || code == 0x76 || code == 0x77) {
            unsupported = 1; /* sequence/value bodies and unknown sections: Python */
            break;
        }
        value = dec_value(&r, &pos, n, 0);
        if (value == NULL)
            goto error;
        if (value == UNSUPPORTED) {
            value = NULL;
            unsupported = 1;
            break;
        }
        PyObject *made = NULL;
        switch (code) {
        case 0x75:
            if (!PyBytes_Check(value)) {
                unsupported = 1;
                break;
            }
            if (body == NULL) {
                body = Py_NewRef(value);
            } else {
                if (parts == NULL) {
                    parts = PyList_New(0);
                    if (parts == NULL || PyList_Append(parts, body) < 0)
                        goto error;
                }
                if (PyList_Append(parts, value) < 0)
                    goto error;
            }
            break;
        case 0x73:
        case 0x70:
            if (!PyList_Check(value)) {
                unsupported = 1;
                break;
            }
            if (code == 0x70) { /* header: validated, not returned */
                if (PyList_GET_SIZE(value) > 5)
                    unsupported = 1;
                break;
            }
            made = fields_dict(value, property_names);
            if (made == NULL)
                goto error;
            if (made == UNSUPPORTED) {
                unsupported = 1;
                break;
            }
            Py_XSETREF(props, made);
            break;
        case 0x74:
            if (!PyDict_Check(value)) {
                unsupported = 1;
                break;
            }
            Py_XSETREF(app, Py_NewRef(value));
            break;
        case 0x72:
        case 0x71:
        case 0x78:
            if (!PyDict_Check(value)) {
                unsupported = 1;
                break;
            }
            made = annotations_dict(value); /* delivery-annotations and footer: validated too */
            if (made == NULL)
                goto error;
            if (code == 0x72)
                Py_XSETREF(ma, made);
            else
                Py_DECREF(made);
            break;
        }
        Py_CLEAR(value);
        if (unsupported)
            break;
    }
    if (unsupported || pos != n) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (parts != NULL) {
        PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
        if (empty == NULL)
            goto error;
        Py_SETREF(body, PyObject_CallMethod(empty, "join", "O", parts));
        Py_DECREF(empty);
        if (body == NULL)
            goto error;
    } else if (body == NULL) {
        body = PyBytes_FromStringAndSize(NULL, 0);
        if (body == NULL)
            goto error;
    }
    result = PyTuple_Pack(4, body, props ? props : Py_None, app ? app : Py_None, ma ? ma : Py_None);
    goto done;
error:
    result = NULL;
done:
    Py_XDECREF(value);
    Py_XDECREF(props);
    Py_XDECREF(app);
    Py_XDECREF(ma);
    Py_XDECREF(body);
    Py_XDECREF(parts);
    return result;
}

static PyObject *configure(PyObject *self, PyObject *args)
{
    PyObject *sym, *ts, *uu, *names;
    if (!PyArg_ParseTuple(args, "OOOO!", &sym, &ts, &uu, &PyTuple_Type, &names))
        return NULL;
    if (!PyType_Check(sym)) {
        PyErr_SetString(PyExc_TypeError, "configure: the first argument must be the Symbol type");
        return NULL;
    }
    Py_XSETREF(Symbol_type, Py_NewRef(sym));
    Py_XSETREF(ts_func, Py_NewRef(ts));
    Py_XSETREF(uuid_func, Py_NewRef(uu));
    Py_XSETREF(property_names, Py_NewRef(names));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"split_entries", split_entries, METH_VARARGS, "Records of a data section or sub-batch (see chunk.py)."},
    {"data_bodies", data_bodies, METH_O, "Bodies of lone-data-section AMQP records (see amqp.py)."},
    {"split_bodies", split_bodies, METH_VARARGS, "split_entries + data_bodies in one pass (see chunk.py)."},
    {"append_bodies", append_bodies, METH_VARARGS, "Bodies of a simple-entries section into buffers (chunk.py)."},
    {"append_list", append_list, METH_VARARGS, "A list of bodies into the same buffers (chunk.py)."},
    {"decode_record", decode_record, METH_O, "Common AMQP message shapes, or None (see amqp.py)."},
    {"configure", configure, METH_VARARGS, "configure(Symbol, ts, uuid_from_bytes, property_names)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_accel", "Optional C loops of the RabbitMQ Streams chunk decoder.", -1, methods,
};

PyMODINIT_FUNC PyInit__accel(void)
{
    return PyModule_Create(&module);
}
