/* The compiled per-request encode core: the loops of `tokenize.base.SegmentEncoder` (plan, resume,
 * assemble) and of `hashing` (the block chain, the chain cache's resume look-up) over the same Python
 * objects, with the same results. `prefixscan/encode_core.py` chooses it or the pure-Python reference
 * (PREFIXSCAN_PURE=1, or when this did not build); tests/test_encode_core.py checks they agree.
 *
 * Hashing stays in the xxhash package: its functions are called through their Python objects (passed in
 * by the caller), on buffers built here, so no hash code is copied into prefixscan.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *s_move_to_end; /* "move_to_end", interned */

/* BytesLRU.get on its OrderedDict `od`: the stored value's first item, marked as just used (new
 * reference), NULL without an error when absent, NULL with an error on failure. */
static PyObject *lru_get(PyObject *od, PyObject *key) {
    PyObject *hit = PyDict_GetItemWithError(od, key);
    if (hit == NULL) return NULL;
    Py_INCREF(hit);
    PyObject *args[2] = {od, key};
    PyObject *r = PyObject_VectorcallMethod(s_move_to_end, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL) { Py_DECREF(hit); return NULL; }
    Py_DECREF(r);
    if (!PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) < 1) {
        Py_DECREF(hit);
        PyErr_SetString(PyExc_TypeError, "LRU entry is not a (value, size) tuple");
        return NULL;
    }
    PyObject *v = PyTuple_GET_ITEM(hit, 0);
    Py_INCREF(v);
    Py_DECREF(hit);
    return v;
}

static PyObject *call1(PyObject *f, PyObject *a) {
    PyObject *args[1] = {a};
    return PyObject_Vectorcall(f, args, 1, NULL);
}

static PyObject *call2(PyObject *f, PyObject *a, PyObject *b) {
    PyObject *args[2] = {a, b};
    return PyObject_Vectorcall(f, args, 2, NULL);
}

/* SegmentMemo.key: h128(text.encode("utf-8", "surrogatepass")); ASCII text is hashed in place. */
static PyObject *text_key(PyObject *h128, PyObject *text) {
    if (PyUnicode_IS_ASCII(text)) {
        PyObject *mv = PyMemoryView_FromMemory((char *)PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text), PyBUF_READ);
        if (mv == NULL) return NULL;
        PyObject *k = call1(h128, mv);
        Py_DECREF(mv);
        return k;
    }
    PyObject *b = PyUnicode_AsEncodedString(text, "utf-8", "surrogatepass");
    if (b == NULL) return NULL;
    PyObject *k = call1(h128, b);
    Py_DECREF(b);
    return k;
}

/* (flag, text) as a unit: the piece itself when it already is exactly that tuple. */
static PyObject *unit(PyObject *piece, PyObject *flag, PyObject *text) {
    if (PyTuple_CheckExact(piece) && PyTuple_GET_ITEM(piece, 0) == flag) {
        Py_INCREF(piece);
        return piece;
    }
    return PyTuple_Pack(2, flag, text);
}

static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL) return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}

static int append_ssize(PyObject *list, Py_ssize_t v) { return append_new(list, PyLong_FromSsize_t(v)); }

/* Whether `text` has at least two newlines. */
static int two_newlines(PyObject *text) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Py_ssize_t i = PyUnicode_FindChar(text, '\n', 0, n, 1);
    if (i < 0) return (int)i == -2 ? -1 : 0;
    i = PyUnicode_FindChar(text, '\n', i + 1, n, 1);
    return i == -2 ? -1 : i >= 0;
}

/* One text piece cut by nothing (SegmentEncoder._plan_text's single-part case). Returns 1, having added
 * nothing, when the text spells a special token (known from `poison`, or new and `spells` says so; then
 * added to `poison`): the caller plans it in Python (`_plan_spelled`). Else 0 (-1 on error). */
static int plan_single(PyObject *piece, PyObject *text, PyObject *units, PyObject *keys, PyObject *memo_d,
                       PyObject *pending, PyObject *poison, PyObject *spells, PyObject *h128) {
    PyObject *k = text_key(h128, text);
    if (k == NULL) return -1;
    int r = PySet_Contains(poison, k);
    if (r != 0) { Py_DECREF(k); return r; }
    r = PyDict_Contains(memo_d, k);
    if (r == 0) r = PyDict_Contains(pending, k);
    if (r < 0) goto fail;
    if (r == 0) { /* new text: checked, then queued */
        int bad = 0;
        if (spells != Py_None) {
            PyObject *s = call1(spells, text);
            if (s == NULL) goto fail;
            bad = PyObject_IsTrue(s);
            Py_DECREF(s);
            if (bad < 0) goto fail;
        }
        if (bad) {
            r = PySet_Add(poison, k);
            Py_DECREF(k);
            return r < 0 ? -1 : 1;
        }
        if (PyDict_SetItem(pending, k, text) < 0) goto fail;
    }
    if (append_new(units, unit(piece, Py_False, text)) < 0 || PyList_Append(keys, k) < 0) goto fail;
    Py_DECREF(k);
    return 0;
fail:
    Py_DECREF(k);
    return -1;
}

/* SegmentEncoder._plan_text's piece-cache case (`_replay`): a piece seen before is cut where it was, its
 * units keyed as they were; units the memo let go are queued again. Returns the units added, 0 when the
 * piece is not held (the caller plans it in Python), -1 on error. */
static Py_ssize_t replay(PyObject *text, PyObject *units, PyObject *keys, PyObject *pieces_d, PyObject *memo_d,
                         PyObject *pending, PyObject *h128) {
    PyObject *pk = text_key(h128, text);
    if (pk == NULL) return -1;
    PyObject *known = lru_get(pieces_d, pk);
    Py_DECREF(pk);
    if (known == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_ssize_t out = -1;
    if (!PyTuple_Check(known) || PyTuple_GET_SIZE(known) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(known, 0)) ||
        !PyBytes_Check(PyTuple_GET_ITEM(known, 1))) {
        PyErr_SetString(PyExc_TypeError, "a piece-cache entry is (starts, keys) bytes");
        goto done;
    }
    PyObject *starts = PyTuple_GET_ITEM(known, 0), *blob = PyTuple_GET_ITEM(known, 1);
    Py_ssize_t n = PyBytes_GET_SIZE(starts) / 4, len = PyUnicode_GET_LENGTH(text);
    if (n < 1 || PyBytes_GET_SIZE(blob) != 16 * n) {
        PyErr_SetString(PyExc_ValueError, "a piece-cache entry's starts and keys differ in count");
        goto done;
    }
    const char *sp = PyBytes_AS_STRING(starts), *kp = PyBytes_AS_STRING(blob);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, sp + 4 * i, 4);
        if (i + 1 < n) memcpy(&b, sp + 4 * (i + 1), 4);
        Py_ssize_t end = i + 1 < n ? (Py_ssize_t)b : len;
        PyObject *sub = PyUnicode_Substring(text, (Py_ssize_t)a, end);
        if (sub == NULL) goto done;
        PyObject *k = PyBytes_FromStringAndSize(kp + 16 * i, 16);
        PyObject *t = k ? PyTuple_Pack(2, Py_False, sub) : NULL;
        int r = t ? 0 : -1;
        if (r == 0) r = PyList_Append(units, t);
        if (r == 0) r = PyList_Append(keys, k);
        if (r == 0) {
            r = PyDict_Contains(memo_d, k);
            if (r == 0) r = PyDict_Contains(pending, k);
            if (r == 0) r = PyDict_SetItem(pending, k, sub);
            else if (r > 0) r = 0;
        }
        Py_XDECREF(t); Py_XDECREF(k); Py_DECREF(sub);
        if (r < 0) goto done;
    }
    out = n;
done:
    Py_DECREF(known);
    return out;
}

/* plan_pieces(p, pieces, start, texts, chars, special_keys, special_key, plan_first, plan_text, multi_chars,
 *             memo_d, pending, poison, spells, h128, pieces_d) -> (units seen, poisoned)
 * SegmentEncoder.plan's loop over pieces[start:]: appends to p.units, p.keys, p.piece_end, p.text_end and
 * p.char_end. A piece the rule may cut (multi_chars >= 0, that long, two newlines) is replayed from the piece
 * cache (`pieces_d`) when held there; when not, it goes to the Python method `plan_text(text, p)`, as does a
 * text that spells a special token, and a first piece with its own encoder to `plan_first(text, p)`; those
 * count their units themselves (the units counted here are the others), and `plan_text` returns how many of
 * the units it added are special tokens (not text units in p.text_end). `poisoned` is always False (the
 * result keeps its shape): `_plan_spelled` sets p.poisoned itself when a text cannot be split. */
static PyObject *plan_pieces(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 16) { PyErr_SetString(PyExc_TypeError, "plan_pieces takes 16 arguments"); return NULL; }
    PyObject *p = a[0], *pieces = a[1], *special_keys = a[5], *special_key = a[6], *plan_first = a[7];
    PyObject *plan_text = a[8], *memo_d = a[10], *pending = a[11], *poison = a[12], *spells = a[13], *h128 = a[14];
    PyObject *pieces_d = a[15];
    Py_ssize_t start = PyLong_AsSsize_t(a[2]), texts = PyLong_AsSsize_t(a[3]), chars = PyLong_AsSsize_t(a[4]);
    Py_ssize_t multi_chars = PyLong_AsSsize_t(a[9]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_Check(pieces) && !PyTuple_Check(pieces)) {
        PyErr_SetString(PyExc_TypeError, "pieces must be a list or tuple");
        return NULL;
    }
    PyObject *units = PyObject_GetAttrString(p, "units"), *keys = PyObject_GetAttrString(p, "keys");
    PyObject *piece_end = PyObject_GetAttrString(p, "piece_end"), *text_end = PyObject_GetAttrString(p, "text_end");
    PyObject *char_end = PyObject_GetAttrString(p, "char_end");
    PyObject *out = NULL;
    Py_ssize_t seen = 0;
    if (!units || !keys || !piece_end || !text_end || !char_end) goto done;
    if (!PyList_Check(units) || !PyList_Check(keys)) { PyErr_SetString(PyExc_TypeError, "units, keys"); goto done; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(pieces);
    for (Py_ssize_t j = start; j < n; j++) {
        PyObject *piece = PySequence_Fast_GET_ITEM(pieces, j);
        if (!PyTuple_Check(piece) || PyTuple_GET_SIZE(piece) != 2) {
            PyErr_SetString(PyExc_TypeError, "a piece is a (special, text) tuple");
            goto done;
        }
        PyObject *text = PyTuple_GET_ITEM(piece, 1);
        if (!PyUnicode_Check(text)) { PyErr_SetString(PyExc_TypeError, "a piece's text is a str"); goto done; }
        int special = PyObject_IsTrue(PyTuple_GET_ITEM(piece, 0));
        if (special < 0) goto done;
        Py_ssize_t before = PyList_GET_SIZE(units);
        if (special) {
            if (append_new(units, unit(piece, Py_True, text)) < 0) goto done;
            PyObject *k = PyDict_GetItemWithError(special_keys, text);
            if (k != NULL && PyObject_IsTrue(k) == 1) {
                if (PyList_Append(keys, k) < 0) goto done;
            } else {
                if (PyErr_Occurred() || append_new(keys, call1(special_key, text)) < 0) goto done;
            }
        } else if (j == 0 && plan_first != Py_None) {
            PyObject *r = call2(plan_first, text, p);
            if (r == NULL) goto done;
            Py_DECREF(r);
        } else {
            int multi = 0;
            if (multi_chars >= 0 && PyUnicode_GET_LENGTH(text) >= multi_chars) {
                multi = two_newlines(text);
                if (multi < 0) goto done;
            }
            int python = 0; /* plan_text plans it */
            if (multi) {
                Py_ssize_t r = replay(text, units, keys, pieces_d, memo_d, pending, h128);
                if (r < 0) goto done;
                seen += r;
                python = r == 0;
            } else {
                int r = plan_single(piece, text, units, keys, memo_d, pending, poison, spells, h128);
                if (r < 0) goto done;
                seen += !r;
                python = r;
            }
            if (python) {
                PyObject *res = call2(plan_text, text, p);
                if (res == NULL) goto done;
                Py_ssize_t nspecial = PyLong_AsSsize_t(res);
                Py_DECREF(res);
                if (nspecial == -1 && PyErr_Occurred()) goto done;
                before += nspecial; /* special-token units are not text units */
            }
        }
        Py_ssize_t after = PyList_GET_SIZE(units);
        texts += special ? 0 : after - before;
        chars += PyUnicode_GET_LENGTH(text);
        if (append_ssize(piece_end, after) < 0 || append_ssize(text_end, texts) < 0 || append_ssize(char_end, chars) < 0)
            goto done;
    }
    out = Py_BuildValue("(nO)", seen, Py_False);
done:
    Py_XDECREF(units); Py_XDECREF(keys); Py_XDECREF(piece_end); Py_XDECREF(text_end); Py_XDECREF(char_end);
    return out;
}

/* A buffer of 4-byte items, C-contiguous. */
static int get_u32(PyObject *o, Py_buffer *v) {
    if (PyObject_GetBuffer(o, v, PyBUF_SIMPLE) < 0) return -1; /* contiguous; no shape or format wanted */
    if (v->itemsize != 4) {
        PyBuffer_Release(v);
        PyErr_SetString(PyExc_TypeError, "token ids must be a contiguous uint32 array");
        return -1;
    }
    return 0;
}

/* assemble(units, keys, u, memo_d, special, miss, base_tokens, base_lens) -> (bytearray of uint32 ids, lens)
 * SegmentEncoder.assemble's loop: each unit from u on is its special token's array or its memo entry (LRU
 * use), or `miss(j, arrays so far)` when the memo let it go; base_tokens (the first sum(base_lens[:u]) ids)
 * lead when u > 0. */
static PyObject *assemble(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 8) { PyErr_SetString(PyExc_TypeError, "assemble takes 8 arguments"); return NULL; }
    PyObject *units = a[0], *keys = a[1], *memo_d = a[3], *special = a[4], *miss = a[5], *base_tokens = a[6];
    PyObject *base_lens = a[7];
    Py_ssize_t u = PyLong_AsSsize_t(a[2]);
    if (u == -1 && PyErr_Occurred()) return NULL;
    if (!PyList_Check(units) || !PyList_Check(keys) || PyList_GET_SIZE(units) != PyList_GET_SIZE(keys)) {
        PyErr_SetString(PyExc_ValueError, "units and keys: lists of one length");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(units), m = n > u ? n - u : 0;
    Py_buffer *views = PyMem_Calloc(m + 1, sizeof(Py_buffer));
    PyObject *lens = NULL, *out = NULL, *ba = NULL;
    Py_ssize_t got = 0, total = 0, head = 0;
    if (views == NULL) { PyErr_NoMemory(); goto done; }
    if (u > 0) {
        if (!PyList_Check(base_lens) || PyList_GET_SIZE(base_lens) < u) {
            PyErr_SetString(PyExc_ValueError, "base_lens");
            goto done;
        }
        for (Py_ssize_t i = 0; i < u; i++) {
            Py_ssize_t v = PyLong_AsSsize_t(PyList_GET_ITEM(base_lens, i));
            if (v == -1 && PyErr_Occurred()) goto done;
            head += v;
        }
    }
    lens = u > 0 ? PyList_GetSlice(base_lens, 0, u) : PyList_New(0); /* the base's lens: one copy */
    if (lens == NULL) goto done;
    for (Py_ssize_t j = u; j < n; j++) {
        PyObject *un = PyList_GET_ITEM(units, j);
        if (!PyTuple_Check(un) || PyTuple_GET_SIZE(un) != 2) {
            PyErr_SetString(PyExc_TypeError, "a unit is a (special, text) tuple");
            goto done;
        }
        int sp = PyObject_IsTrue(PyTuple_GET_ITEM(un, 0));
        if (sp < 0) goto done;
        PyObject *arr;
        if (sp) {
            arr = PyObject_GetItem(special, PyTuple_GET_ITEM(un, 1));
        } else {
            arr = lru_get(memo_d, PyList_GET_ITEM(keys, j));
            if (arr == NULL && !PyErr_Occurred()) {
                PyObject *jj = PyLong_FromSsize_t(j), *kk = PyLong_FromSsize_t(got);
                if (jj && kk) arr = call2(miss, jj, kk);
                Py_XDECREF(jj); Py_XDECREF(kk);
            }
        }
        if (arr == NULL) goto done;
        int r = get_u32(arr, &views[got]);
        Py_DECREF(arr); /* the memo, the special table or the view keeps it alive while viewed */
        if (r < 0) goto done;
        Py_ssize_t len = views[got].len / 4;
        got++;
        total += len;
        if (append_ssize(lens, len) < 0) goto done;
    }
    Py_buffer hv = {0};
    int have_head = 0;
    if (u > 0) {
        if (get_u32(base_tokens, &hv) < 0) goto done;
        have_head = 1;
        if (hv.len / 4 < head) {
            PyBuffer_Release(&hv);
            PyErr_SetString(PyExc_ValueError, "base tokens shorter than their units");
            goto done;
        }
    }
    ba = PyByteArray_FromStringAndSize(NULL, (head + total) * 4);
    if (ba != NULL) {
        char *dst = PyByteArray_AS_STRING(ba);
        if (have_head) memcpy(dst, hv.buf, head * 4);
        dst += head * 4;
        for (Py_ssize_t i = 0; i < got; i++) {
            memcpy(dst, views[i].buf, views[i].len);
            dst += views[i].len;
        }
        out = PyTuple_Pack(2, ba, lens);
    }
    if (have_head) PyBuffer_Release(&hv);
done:
    if (views != NULL) {
        for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
        PyMem_Free(views);
    }
    Py_XDECREF(ba);
    Py_XDECREF(lens);
    return out;
}

static void put_le64(unsigned char *d, uint64_t v) {
    for (int i = 0; i < 8; i++) d[i] = (unsigned char)(v >> (8 * i));
}

/* block_chain(tokens, block_size, parent, h64) -> bytearray of uint64 (native order)
 * hashing.block_hashes' chain: for each full block, parent = h64(parent as 8 little-endian bytes + the
 * block's uint32 ids as given, little-endian). */
static PyObject *block_chain(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 4) { PyErr_SetString(PyExc_TypeError, "block_chain takes 4 arguments"); return NULL; }
    Py_ssize_t bs = PyLong_AsSsize_t(a[1]);
    uint64_t parent = PyLong_AsUnsignedLongLong(a[2]);
    if (PyErr_Occurred()) return NULL;
    if (bs <= 0) { PyErr_SetString(PyExc_ValueError, "block_size must be positive"); return NULL; }
    Py_buffer v;
    if (get_u32(a[0], &v) < 0) return NULL;
    Py_ssize_t nfull = (v.len / 4) / bs, step = bs * 4;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, nfull * 8);
    PyObject *buf = out ? PyByteArray_FromStringAndSize(NULL, 8 + step) : NULL;
    if (buf == NULL) goto fail;
    unsigned char *b = (unsigned char *)PyByteArray_AS_STRING(buf);
    uint64_t *dst = (uint64_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < nfull; i++) {
        put_le64(b, parent);
        memcpy(b + 8, (char *)v.buf + i * step, step);
        PyObject *h = call1(a[3], buf);
        if (h == NULL) goto fail;
        parent = PyLong_AsUnsignedLongLong(h);
        Py_DECREF(h);
        if (parent == (uint64_t)-1 && PyErr_Occurred()) goto fail;
        dst[i] = parent;
    }
    Py_DECREF(buf);
    PyBuffer_Release(&v);
    return out;
fail:
    Py_XDECREF(buf);
    Py_XDECREF(out);
    PyBuffer_Release(&v);
    return NULL;
}

/* chain_keys(piece_keys, piece_lens, root, checkpoints, lru_d, block_size, h128int)
 *   -> ((j, key, value) or None, [(key, blocks) per checkpoint in range]) or None
 * ChainCache.segments' prefix keys in one pass, for the usual case of 16-byte piece keys and a list of
 * lens (None otherwise: the caller takes the reference path). Key j is h128int over the root (8 bytes,
 * little-endian) and piece_keys[:j + 1] joined (`_PrefixKeys`); ends are the running sums of piece_lens.
 * The search is `ChainCache._keys`' (the longest remembered prefix whose stored block count equals
 * ends[j] // block_size, each probe an LRU use); then each checkpoint j with 0 <= j < n gets its key and
 * ends[j] // block_size, for `_remember`. */
static PyObject *probe(PyObject *od, PyObject *h, const char *data, const Py_ssize_t *ends, Py_ssize_t n,
                       Py_ssize_t bs) {
    for (Py_ssize_t j = n - 1; j >= 0; j--) {
        PyObject *mv = PyMemoryView_FromMemory((char *)data, 24 + 16 * j, PyBUF_READ);
        if (mv == NULL) return NULL;
        PyObject *key = call1(h, mv);
        Py_DECREF(mv);
        if (key == NULL) return NULL;
        PyObject *hit = lru_get(od, key);
        if (hit == NULL) {
            Py_DECREF(key);
            if (PyErr_Occurred()) return NULL;
            continue;
        }
        if (PyTuple_Check(hit) && PyTuple_GET_SIZE(hit) == 2) {
            PyObject *want = PyLong_FromSsize_t(ends[j] / bs);
            int eq = want ? PyObject_RichCompareBool(PyTuple_GET_ITEM(hit, 1), want, Py_EQ) : -1;
            Py_XDECREF(want);
            if (eq < 0) { Py_DECREF(key); Py_DECREF(hit); return NULL; }
            if (eq) return Py_BuildValue("(nNN)", j, key, hit);
        }
        Py_DECREF(key);
        Py_DECREF(hit);
    }
    Py_RETURN_NONE;
}

static PyObject *chain_keys(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 7) { PyErr_SetString(PyExc_TypeError, "chain_keys takes 7 arguments"); return NULL; }
    PyObject *keys = a[0], *lens = a[1], *cps = a[3], *od = a[4], *h = a[6];
    uint64_t root = PyLong_AsUnsignedLongLong(a[2]);
    Py_ssize_t bs = PyLong_AsSsize_t(a[5]);
    if (PyErr_Occurred()) return NULL;
    if (bs <= 0) { PyErr_SetString(PyExc_ValueError, "block_size must be positive"); return NULL; }
    if (!PyList_Check(keys) || !PyList_Check(lens) || !PyList_Check(cps) ||
        PyList_GET_SIZE(lens) != PyList_GET_SIZE(keys))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *k = PyList_GET_ITEM(keys, j);
        if (!PyBytes_Check(k) || PyBytes_GET_SIZE(k) != 16) Py_RETURN_NONE;
    }
    char *data = PyMem_Malloc(8 + 16 * n + 1);
    Py_ssize_t *ends = PyMem_Malloc(sizeof(Py_ssize_t) * (n + 1));
    PyObject *found = NULL, *out = NULL, *marks = NULL;
    if (data == NULL || ends == NULL) { PyErr_NoMemory(); goto done; }
    put_le64((unsigned char *)data, root);
    Py_ssize_t sum = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        memcpy(data + 8 + 16 * j, PyBytes_AS_STRING(PyList_GET_ITEM(keys, j)), 16);
        Py_ssize_t v = PyLong_AsSsize_t(PyList_GET_ITEM(lens, j));
        if (v == -1 && PyErr_Occurred()) goto done;
        ends[j] = sum += v;
    }
    found = probe(od, h, data, ends, n, bs);
    if (found == NULL) goto done;
    marks = PyList_New(0);
    if (marks == NULL) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(cps); i++) {
        Py_ssize_t j = PyLong_AsSsize_t(PyList_GET_ITEM(cps, i));
        if (j == -1 && PyErr_Occurred()) goto done;
        if (j < 0 || j >= n) continue;
        PyObject *mv = PyMemoryView_FromMemory(data, 24 + 16 * j, PyBUF_READ);
        PyObject *key = mv ? call1(h, mv) : NULL;
        Py_XDECREF(mv);
        if (key == NULL) goto done;
        if (append_new(marks, Py_BuildValue("(Nn)", key, ends[j] / bs)) < 0) goto done;
    }
    out = PyTuple_Pack(2, found, marks);
done:
    Py_XDECREF(found);
    Py_XDECREF(marks);
    PyMem_Free(data);
    PyMem_Free(ends);
    return out;
}

/* piece_digests(pieces, old, special_keys, special_key, h128) -> (i, bytes)
 * SegmentEncoder._piece_digests: the 16-byte digests of the (special, text) pieces in order, a special
 * piece's its special key (special_keys[text], else special_key(text)), a text piece's h128(its utf-8,
 * seed 1); with `old` (bytes), only while they equal old's, so i is how many leading pieces are the same. */
static PyObject *piece_digests(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 5) { PyErr_SetString(PyExc_TypeError, "piece_digests takes 5 arguments"); return NULL; }
    PyObject *pieces = a[0], *old = a[1], *specials = a[2], *special_key = a[3], *h = a[4];
    if (!PyList_Check(pieces) || (old != Py_None && !PyBytes_Check(old)) || !PyDict_Check(specials)) {
        PyErr_SetString(PyExc_TypeError, "piece_digests: a list of pieces, bytes or None, a dict");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(pieces), i = 0;
    if (old != Py_None && PyBytes_GET_SIZE(old) / 16 < n) n = PyBytes_GET_SIZE(old) / 16;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 16 * n), *seed = PyLong_FromLong(1), *res = NULL;
    if (out == NULL || seed == NULL) goto done;
    for (; i < n; i++) {
        PyObject *piece = PyList_GET_ITEM(pieces, i);
        if (!PyTuple_Check(piece) || PyTuple_GET_SIZE(piece) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(piece, 1))) {
            PyErr_SetString(PyExc_TypeError, "a piece is a (special, text) tuple");
            goto done;
        }
        PyObject *text = PyTuple_GET_ITEM(piece, 1), *d;
        int sp = PyObject_IsTrue(PyTuple_GET_ITEM(piece, 0));
        if (sp < 0) goto done;
        if (sp) {
            d = PyDict_GetItemWithError(specials, text);
            if (d != NULL) Py_INCREF(d);
            else if (!PyErr_Occurred()) d = call1(special_key, text);
        } else if (PyUnicode_IS_ASCII(text)) {
            PyObject *mv = PyMemoryView_FromMemory((char *)PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text), PyBUF_READ);
            d = mv ? call2(h, mv, seed) : NULL;
            Py_XDECREF(mv);
        } else {
            PyObject *b = PyUnicode_AsEncodedString(text, "utf-8", "surrogatepass");
            d = b ? call2(h, b, seed) : NULL;
            Py_XDECREF(b);
        }
        if (d == NULL) goto done;
        if (!PyBytes_Check(d) || PyBytes_GET_SIZE(d) != 16) {
            Py_DECREF(d);
            PyErr_SetString(PyExc_TypeError, "a digest is 16 bytes");
            goto done;
        }
        char *dst = PyBytes_AS_STRING(out) + 16 * i;
        int same = old == Py_None || memcmp(PyBytes_AS_STRING(old) + 16 * i, PyBytes_AS_STRING(d), 16) == 0;
        memcpy(dst, PyBytes_AS_STRING(d), 16);
        Py_DECREF(d);
        if (!same) break;
    }
    if (i < n && _PyBytes_Resize(&out, 16 * i) < 0) goto done;
    res = Py_BuildValue("(nO)", i, out);
done:
    Py_XDECREF(out);
    Py_XDECREF(seed);
    return res;
}

/* The body of a message whose role is a str, content a str or None, and which has no truthy tool_calls
 * or name (render._message_body's common case): f"{role}\n{content}"; NULL without an error otherwise. */
static PyObject *simple_body(PyObject *m, PyObject *nl) {
    PyObject *role = PyDict_GetItemString(m, "role"), *content = PyDict_GetItemString(m, "content");
    if (role == NULL || !PyUnicode_CheckExact(role)) return NULL;
    if (content != NULL && content != Py_None && !PyUnicode_CheckExact(content)) return NULL;
    const char *other[2] = {"tool_calls", "name"};
    for (int i = 0; i < 2; i++) {
        PyObject *v = PyDict_GetItemString(m, other[i]);
        if (v != NULL && v != Py_None) {
            int t = PyObject_IsTrue(v);
            if (t != 0) return NULL; /* truthy: the Python path; an error: raised */
        }
    }
    PyObject *head = PyUnicode_Concat(role, nl);
    if (head == NULL || content == NULL || content == Py_None) return head;
    PyObject *out = PyUnicode_Concat(head, content);
    Py_DECREF(head);
    return out;
}

static int is_system(PyObject *m) {
    PyObject *role = PyDict_GetItemString(m, "role");
    return role != NULL && PyUnicode_Check(role) &&
           (PyUnicode_CompareWithASCIIString(role, "system") == 0 ||
            PyUnicode_CompareWithASCIIString(role, "developer") == 0);
}

static int add_message(PyObject *out, PyObject *m, PyObject *body_fn, PyObject *const *c) {
    PyObject *body = simple_body(m, c[3]);
    if (body == NULL) {
        if (PyErr_Occurred()) return -1;
        body = call1(body_fn, m);
        if (body == NULL) return -1;
    }
    PyObject *t = PyTuple_Pack(2, Py_False, body);
    Py_DECREF(body);
    if (t == NULL) return -1;
    int r = PyList_Append(out, c[0]);
    if (r == 0) r = PyList_Append(out, t);
    if (r == 0) r = PyList_Append(out, c[1]);
    if (r == 0) r = PyList_Append(out, c[2]);
    Py_DECREF(t);
    return r;
}

/* render_pieces(messages, tools, tools_text, body_fn, start, end, newline_piece, newline, generation)
 *   -> (pieces list, head pieces), or None when a message is not a dict (the Python path then renders)
 * render.render_chatml's layout: leading system/developer messages, the tools block (tools_text(tools)
 * when tools is truthy), the other messages, each as start, (False, body), end, newline_piece; then
 * start and the generation prompt piece. Bodies not in the common case come from body_fn(message). */
static PyObject *render_pieces(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 9) { PyErr_SetString(PyExc_TypeError, "render_pieces takes 9 arguments"); return NULL; }
    PyObject *messages = a[0], *tools = a[1], *tools_text = a[2], *body_fn = a[3];
    PyObject *c[4] = {a[4], a[5], a[6], a[7]};
    if (!PyList_Check(messages)) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(messages), i = 0;
    for (Py_ssize_t j = 0; j < n; j++)
        if (!PyDict_Check(PyList_GET_ITEM(messages, j))) Py_RETURN_NONE;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (; i < n && is_system(PyList_GET_ITEM(messages, i)); i++)
        if (add_message(out, PyList_GET_ITEM(messages, i), body_fn, c) < 0) goto fail;
    int has_tools = PyObject_IsTrue(tools);
    if (has_tools < 0) goto fail;
    if (has_tools) {
        PyObject *text = call1(tools_text, tools);
        if (text == NULL) goto fail;
        PyObject *t = PyTuple_Pack(2, Py_False, text);
        Py_DECREF(text);
        if (t == NULL) goto fail;
        int r = PyList_Append(out, c[0]);
        if (r == 0) r = PyList_Append(out, t);
        if (r == 0) r = PyList_Append(out, c[1]);
        if (r == 0) r = PyList_Append(out, c[2]);
        Py_DECREF(t);
        if (r < 0) goto fail;
    }
    Py_ssize_t head = PyList_GET_SIZE(out);
    for (; i < n; i++)
        if (add_message(out, PyList_GET_ITEM(messages, i), body_fn, c) < 0) goto fail;
    if (PyList_Append(out, c[0]) < 0 || PyList_Append(out, a[8]) < 0) goto fail;
    return Py_BuildValue("(Nn)", out, head);
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"render_pieces", (PyCFunction)(void (*)(void))render_pieces, METH_FASTCALL, "render_chatml's layout."},
    {"plan_pieces", (PyCFunction)(void (*)(void))plan_pieces, METH_FASTCALL, "SegmentEncoder.plan's loop."},
    {"assemble", (PyCFunction)(void (*)(void))assemble, METH_FASTCALL, "SegmentEncoder.assemble's loop."},
    {"block_chain", (PyCFunction)(void (*)(void))block_chain, METH_FASTCALL, "Chained block hashes."},
    {"chain_keys", (PyCFunction)(void (*)(void))chain_keys, METH_FASTCALL, "ChainCache's prefix keys."},
    {"piece_digests", (PyCFunction)(void (*)(void))piece_digests, METH_FASTCALL, "Pieces' digests."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_core", "Compiled per-request encode core.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__core(void) {
    s_move_to_end = PyUnicode_InternFromString("move_to_end");
    if (s_move_to_end == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    /* The calling convention's version: encode_core.py takes a build only when it matches (a stale build
     * left by an older install then means the pure path, not wrong arguments). */
    if (m != NULL && PyModule_AddIntConstant(m, "API", 2) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
