/* Estimated JSON size of plain values, in one C call: the walker's "is this small?" check,
 * and its plan of a short block made from those estimates.
 *
 * The pure-Python check (``Walker.size``) costs 25-45 ns a node, two to three times what
 * orjson spends writing the node; this one costs a few. It reads types and lengths only and
 * never calls back into Python (no hashing, no comparison, no attribute lookup), so the
 * values cannot change under it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* A dict's items are read straight from its entries where CPython's layout of them is known:
 * PyDict_Next, a call per item, was half the check's time on documents of small dicts. The
 * head of the keys object below is CPython's own (Include/internal/pycore_dict.h), the same
 * in 3.11, 3.12 and 3.13 built with the GIL; its internal headers cannot be included from an
 * extension on 3.12, so it is declared here. Anywhere else, and for a split table (an
 * instance's __dict__), PyDict_Next. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED) \
    && !defined(PYPY_VERSION)
#define DIRECT_ITEMS 1
typedef struct {
    Py_ssize_t dk_refcnt;
    uint8_t dk_log2_size;
    uint8_t dk_log2_index_bytes;
    uint8_t dk_kind; /* 0: any keys, entries (hash, key, value); 1: str keys, (key, value) */
    uint32_t dk_version;
    Py_ssize_t dk_usable;
    Py_ssize_t dk_nentries; /* entries in use or deleted (value NULL) */
    char dk_indices[];      /* the hash table; the entries follow it */
} KeysHead;
#endif

typedef struct {
    PyObject **entry; /* the next entry's key slot, its value slot right after it */
    PyObject **end;
    Py_ssize_t stride; /* pointers per entry */
    PyObject *dict;    /* for PyDict_Next, where the entries are not read directly */
    Py_ssize_t pos;
} Items;

static inline void
items_init(Items *it, PyObject *dict)
{
    it->entry = it->end = NULL;
    it->stride = 0;
    it->dict = dict;
    it->pos = 0;
#ifdef DIRECT_ITEMS
    PyDictObject *d = (PyDictObject *)dict;
    KeysHead *keys = (KeysHead *)d->ma_keys;
    if (d->ma_values == NULL && keys->dk_kind <= 1) {
        PyObject **entries =
            (PyObject **)(keys->dk_indices + ((size_t)1 << keys->dk_log2_index_bytes));
        it->stride = keys->dk_kind == 0 ? 3 : 2;
        it->entry = entries + (keys->dk_kind == 0 ? 1 : 0);
        it->end = it->entry + it->stride * keys->dk_nentries;
        it->dict = NULL;
    }
#endif
}

/* The next item in the dict's order, as PyDict_Next gives it; 0 at the end. */
static inline int
items_next(Items *it, PyObject **key, PyObject **value)
{
    if (it->dict != NULL) {
        return PyDict_Next(it->dict, &it->pos, key, value);
    }
    while (it->entry < it->end) {
        PyObject **e = it->entry;
        it->entry += it->stride;
        if (e[1] != NULL) {
            *key = e[0];
            *value = e[1];
            return 1;
        }
    }
    return 0;
}

/* Containers nested deeper than orjson goes (254) are never written whole. */
#define MAX_DEPTH 254
#define BIG (((Py_ssize_t)1) << 62)
/* Returned for nesting deeper than MAX_DEPTH, so the caller can stop looking below it. */
#define DEEP (BIG + 1)
/* Items of a long list, tuple or dict read before projecting its size (see projected_past). */
#define PREFIX 16

typedef struct {
    Py_ssize_t total;
    Py_ssize_t limit;
    PyObject *leaves; /* tuple of types written as small leaves (datetime, ...) */
} State;

static int add(State *s, PyObject *obj, int depth);

/* Add a str, int, float, bool or None's estimated size and return 1; 0 for anything else.
 * Inlined into the loops over a container's items: most nodes are such leaves, and a call
 * for each costs more than the check. */
static inline int
add_leaf(State *s, PyObject *obj)
{
    PyTypeObject *t = Py_TYPE(obj);
    if (t == &PyUnicode_Type) {
        s->total += PyUnicode_GET_LENGTH(obj) + 2;
    }
    else if (t == &PyLong_Type) {
        s->total += 8;
    }
    else if (t == &PyFloat_Type) {
        s->total += 20;
    }
    else if (obj == Py_None || t == &PyBool_Type) {
        s->total += 5;
    }
    else {
        return 0;
    }
    return 1;
}

/* Whether a long container whose first PREFIX items came to ``s->total - start`` is, at that
 * rate, past the limit; if so its estimate becomes that projection. Reading on to the limit
 * would cost more than orjson spends on as much JSON where nodes are tiny (~10 ns a node in
 * dicts), and it is read again when the container is walked. A wrong "too big" only costs a
 * few more steps; "small" is only ever said after reading everything. */
static int
projected_past(State *s, Py_ssize_t start, Py_ssize_t n)
{
    double projected = (double)(s->total - start) * ((double)n / PREFIX);
    if (projected <= (double)s->limit || projected >= (double)(BIG / 2)) {
        return 0;
    }
    s->total = start + (Py_ssize_t)projected;
    return 1;
}

/* Add items[i:] of a list of n items whose items were counted from ``start``; ``numbers``:
 * items[:i] were all floats and ints, so the run of numbers goes on from i. */
/* Past items[i:] while they are all of the type of items[i], if that is a number type: the
 * index after them, their estimate added. Per-token arrays (token ids, masks, logprobs) are
 * most elements of an episode, and one type throughout: comparing one pointer an element,
 * and stopping only where the limit will be passed, is the cheapest check there is. */
static inline Py_ssize_t
skip_same_numbers(State *s, PyObject **items, Py_ssize_t n, Py_ssize_t i)
{
    if (i >= n) {
        return i;
    }
    PyTypeObject *t = Py_TYPE(items[i]);
    Py_ssize_t per = t == &PyLong_Type ? 8 : t == &PyFloat_Type ? 20 : t == &PyBool_Type ? 5 : 0;
    if (per == 0) {
        return i;
    }
    /* at most one item past the limit */
    Py_ssize_t room = s->total > s->limit ? 1 : (s->limit - s->total) / per + 1;
    Py_ssize_t stop = n - i > room ? i + room : n;
    Py_ssize_t j = i;
    /* four at a time: the loads of one group do not wait on the branch of the last */
    while (j + 4 <= stop && Py_TYPE(items[j]) == t && Py_TYPE(items[j + 1]) == t
           && Py_TYPE(items[j + 2]) == t && Py_TYPE(items[j + 3]) == t) {
        j += 4;
    }
    while (j < stop && Py_TYPE(items[j]) == t) {
        j++;
    }
    s->total += (j - i) * per;
    return j;
}

static int
add_rest(State *s, PyObject **items, Py_ssize_t n, Py_ssize_t i, Py_ssize_t start, int depth,
         int numbers)
{
    if (numbers) {
        i = skip_same_numbers(s, items, n, i);
        if (s->total > s->limit) {
            return 1;
        }
    }
    /* A run of numbers (token ids, logprobs) in a tight loop of its own: most elements of an
     * episode are such numbers. */
    for (; numbers && i < n; i++) {
        PyTypeObject *t = Py_TYPE(items[i]);
        if (t == &PyFloat_Type) {
            s->total += 20;
        }
        else if (t == &PyLong_Type) {
            s->total += 8;
        }
        else {
            break;
        }
        if (s->total > s->limit) {
            return 1;
        }
    }
    for (; i < n; i++) {
        if (i == PREFIX && n >= 4 * PREFIX && projected_past(s, start, n)) {
            return 1;
        }
        if (add_leaf(s, items[i])) {
            if (s->total > s->limit) {
                return 1;
            }
        }
        else if (add(s, items[i], depth)) {
            return 1;
        }
    }
    return 0;
}

static int
add_items(State *s, PyObject **items, Py_ssize_t n, int depth)
{
    s->total += 2 + n;
    if (s->total > s->limit) {
        return 1;
    }
    return add_rest(s, items, n, 0, s->total, depth, 1);
}

/* A key's estimated size with its quotes, colon and comma. */
static inline Py_ssize_t
key_size(PyObject *key)
{
    return Py_TYPE(key) == &PyUnicode_Type ? PyUnicode_GET_LENGTH(key) + 4 : 24;
}

static int
add_dict(State *s, PyObject *obj, int depth)
{
    Py_ssize_t i = 0, n = PyDict_GET_SIZE(obj);
    PyObject *key, *value;
    Items items;
    items_init(&items, obj);
    s->total += 2;
    Py_ssize_t start = s->total;
    while (items_next(&items, &key, &value)) {
        if (i++ == PREFIX && n >= 4 * PREFIX && projected_past(s, start, n)) {
            return 1;
        }
        s->total += key_size(key);
        if (add_leaf(s, value)) {
            if (s->total > s->limit) {
                return 1;
            }
        }
        else if (add(s, value, depth)) {
            return 1;
        }
    }
    return 0;
}

static int
is_leaf_type(State *s, PyTypeObject *t)
{
    Py_ssize_t n = PyTuple_GET_SIZE(s->leaves);
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((PyObject *)t == PyTuple_GET_ITEM(s->leaves, i)) {
            return 1;
        }
    }
    return 0;
}

/* Add obj's estimated size; 1 once past the limit or on a value that must be walked.
 * ``depth`` is the nesting of the containers that hold obj. */
static int
add(State *s, PyObject *obj, int depth)
{
    if (add_leaf(s, obj)) {
        return s->total > s->limit;
    }
    PyTypeObject *t = Py_TYPE(obj);
    if (t == &PyList_Type || t == &PyTuple_Type || t == &PyDict_Type) {
        if (depth >= MAX_DEPTH) {
            s->total = DEEP;
            return 1;
        }
        if (t == &PyList_Type) {
            return add_items(s, ((PyListObject *)obj)->ob_item, PyList_GET_SIZE(obj), depth + 1);
        }
        if (t == &PyTuple_Type) {
            return add_items(s, ((PyTupleObject *)obj)->ob_item, PyTuple_GET_SIZE(obj), depth + 1);
        }
        return add_dict(s, obj, depth + 1);
    }
    if (is_leaf_type(s, t)) {
        s->total += 40;
        return s->total > s->limit;
    }
    s->total = BIG;
    return 1;
}

PyDoc_STRVAR(size_doc,
"size(values, limit, leaves, /) -> int\n\n"
"Estimated JSON bytes of the list or tuple ``values`` and everything it holds: more than\n"
"``limit`` once past it (the walk stops there, or sooner where the first 16 items of a long\n"
"list or dict project past the limit), ``1 << 62`` on meeting a value that is not\n"
"a str, int, float, bool, None, exact dict, list or tuple, or a type in ``leaves``, and\n"
"``(1 << 62) + 1`` on nesting deeper than orjson writes.");

/* A fresh State from the ``limit`` and ``leaves`` arguments; -1 with an exception set when
 * they are not an int and a tuple. */
static int
init_state(State *s, PyObject *limit, PyObject *leaves)
{
    s->total = 0;
    s->limit = PyLong_AsSsize_t(limit);
    if (s->limit == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (!PyTuple_CheckExact(leaves)) {
        PyErr_SetString(PyExc_TypeError, "leaves must be a tuple of types");
        return -1;
    }
    s->leaves = leaves;
    return 0;
}

static PyObject *
csize_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "size() takes exactly 3 arguments");
        return NULL;
    }
    PyObject *values = args[0];
    State s;
    if (init_state(&s, args[1], args[2]) < 0) {
        return NULL;
    }
    if (PyList_CheckExact(values)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(values); i++) {
            if (add(&s, PyList_GET_ITEM(values, i), 0)) {
                break;
            }
        }
    }
    else if (PyTuple_CheckExact(values)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(values); i++) {
            if (add(&s, PyTuple_GET_ITEM(values, i), 0)) {
                break;
            }
        }
    }
    else {
        PyErr_SetString(PyExc_TypeError, "values must be a list or tuple");
        return NULL;
    }
    return PyLong_FromSsize_t(s.total);
}

PyDoc_STRVAR(numbers_doc,
"numbers(values, /) -> int\n\n"
"Estimated JSON bytes of the list or tuple ``values`` if it holds only ints, bools and\n"
"floats (8 an element, 20 with a float among them), else ``1 << 62``.");

static PyObject *
csize_numbers(PyObject *module, PyObject *values)
{
    PyObject **items;
    Py_ssize_t n;
    if (PyList_CheckExact(values)) {
        items = ((PyListObject *)values)->ob_item;
        n = PyList_GET_SIZE(values);
    }
    else if (PyTuple_CheckExact(values)) {
        items = ((PyTupleObject *)values)->ob_item;
        n = PyTuple_GET_SIZE(values);
    }
    else {
        PyErr_SetString(PyExc_TypeError, "values must be a list or tuple");
        return NULL;
    }
    int floats = 0;
    Py_ssize_t i = 0;
    if (n > 0) {
        /* most often one type throughout: one pointer compared an element */
        PyTypeObject *first = Py_TYPE(items[0]);
        while (i + 4 <= n && Py_TYPE(items[i]) == first && Py_TYPE(items[i + 1]) == first
               && Py_TYPE(items[i + 2]) == first && Py_TYPE(items[i + 3]) == first) {
            i += 4;
        }
        while (i < n && Py_TYPE(items[i]) == first) {
            i++;
        }
        if (first == &PyFloat_Type) {
            floats = 1;
        }
        else if (first != &PyLong_Type && first != &PyBool_Type) {
            return PyLong_FromSsize_t(BIG);
        }
    }
    for (; i < n; i++) {
        PyTypeObject *t = Py_TYPE(items[i]);
        if (t == &PyFloat_Type) {
            floats = 1;
        }
        else if (t != &PyLong_Type && t != &PyBool_Type) {
            return PyLong_FromSsize_t(BIG);
        }
    }
    return PyLong_FromSsize_t((floats ? 20 : 8) * n);
}

/* Kinds of a plan segment, as in _walk.py: a run written together, one element alone
 * (not plain JSON), one element alone because it is large. */
#define RUN 0
#define ALONE 1
#define ALONE_BIG 2
/* Blocks this short are planned (PLAN_ELEMENTS in _walk.py); a large element this short
 * gets the sizes of its own elements measured on the way, for its own plan. */
#define PLAN_ELEMENTS 32

/* One element's estimate from 0, as ``size([value], ...)`` gives it. When the element is a
 * plain container short enough to be planned itself, its elements' estimates are recorded in
 * ``sizes`` (-1 where not known: not reached before the limit, or too deep to tell) and
 * ``*count`` is set to how many it holds; for a longer list or tuple, the estimates of its
 * first PREFIX elements (all a projection reads), and ``*count`` is PREFIX. Else ``*count``
 * stays -1. */
static Py_ssize_t
measure(State *s, PyObject *value, Py_ssize_t *sizes, Py_ssize_t *count)
{
    s->total = 0;
    *count = -1;
    PyTypeObject *t = Py_TYPE(value);
    PyObject **items = NULL;
    Py_ssize_t n = 0; /* stays 0 for anything but a list, tuple or dict: measured whole */
    if (t == &PyList_Type) {
        items = ((PyListObject *)value)->ob_item;
        n = PyList_GET_SIZE(value);
    }
    else if (t == &PyTuple_Type) {
        items = ((PyTupleObject *)value)->ob_item;
        n = PyTuple_GET_SIZE(value);
    }
    else if (t == &PyDict_Type) {
        n = PyDict_GET_SIZE(value);
    }
    if (n == 0 || (n > PLAN_ELEMENTS && items == NULL)) {
        add(s, value, 0);
        return s->total;
    }
    /* The same sums as add_items / add_dict, element by element. */
    Py_ssize_t recorded = n <= PLAN_ELEMENTS ? n : PREFIX;
    *count = recorded;
    for (Py_ssize_t i = 0; i < recorded; i++) {
        sizes[i] = -1;
    }
    Py_ssize_t i = 0;
    PyObject *key, *item;
    Items entries;
    if (items == NULL) {
        items_init(&entries, value);
    }
    s->total = items != NULL ? 2 + n : 2;
    if (items != NULL && s->total > s->limit) {
        return s->total;
    }
    Py_ssize_t start = s->total;
    int numbers = 1; /* so far only floats and ints, as add_items' first loop reads them */
    for (;; i++) {
        if (items != NULL) {
            if (i >= n) {
                break;
            }
            if (i == recorded) {
                /* the rest of a long list, unrecorded, exactly as add_items reads it */
                add_rest(s, items, n, i, start, 1, numbers);
                break;
            }
            item = items[i];
            numbers = numbers && (Py_TYPE(item) == &PyFloat_Type || Py_TYPE(item) == &PyLong_Type);
        }
        else {
            if (!items_next(&entries, &key, &item)) {
                break;
            }
            s->total += key_size(key);
        }
        Py_ssize_t before = s->total;
        int stop = add_leaf(s, item) ? s->total > s->limit : add(s, item, 1);
        if (s->total == DEEP) {
            return DEEP; /* sizes[i] stays unknown: measured alone it may not be too deep */
        }
        if (s->total == BIG) {
            sizes[i] = BIG;
            return BIG;
        }
        Py_ssize_t own = s->total - before;
        if (!stop || own > s->limit) {
            sizes[i] = own;
        }
        if (stop) {
            break;
        }
    }
    return s->total;
}

PyDoc_STRVAR(plan_doc,
"plan(block, is_map, limit, leaves, sizes, /) -> (list, bool)\n\n"
"The walker's plan of a short block (a list of values, or of (key, value) pairs when\n"
"``is_map``): segments ``(start, end, kind)``, runs of elements up to ``limit`` estimated\n"
"bytes written together and large ones alone, as ``Walker.plan`` makes them from ``size``.\n"
"A large plain container short enough to be planned itself comes as ``(start, end, kind,\n"
"sizes)``, ``sizes`` being its elements' estimates as far as they were measured (-1 where\n"
"not), to pass back here for its own plan; a longer large list or tuple, with its first 16\n"
"elements' estimates. ``sizes`` (or None) are such estimates for this\n"
"block's elements. The bool says a value nested deeper than orjson writes was met.");

typedef struct {
    Py_ssize_t start, end, count; /* count: how many of ``sizes`` belong to this segment */
    int kind;
    Py_ssize_t sizes[PLAN_ELEMENTS];
} Segment;

static void
set_run(Segment *g, Py_ssize_t start, Py_ssize_t end)
{
    g->start = start;
    g->end = end;
    g->kind = RUN;
    g->count = 0;
}

/* The plan is worked out first and built as Python objects after: an allocation may run a
 * garbage collection, and so Python code, which must not happen while items are read. */
static PyObject *
build_plan(Segment *segments, Py_ssize_t count, int deep)
{
    PyObject *plan = PyList_New(count);
    if (plan == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        Segment *g = &segments[i];
        PyObject *segment;
        if (g->count > 0) {
            PyObject *inner = PyTuple_New(g->count);
            if (inner == NULL) {
                Py_DECREF(plan);
                return NULL;
            }
            for (Py_ssize_t j = 0; j < g->count; j++) {
                PyObject *v = PyLong_FromSsize_t(g->sizes[j]);
                if (v == NULL) {
                    Py_DECREF(inner);
                    Py_DECREF(plan);
                    return NULL;
                }
                PyTuple_SET_ITEM(inner, j, v);
            }
            segment = Py_BuildValue("(nniN)", g->start, g->end, g->kind, inner);
        }
        else {
            segment = Py_BuildValue("(nni)", g->start, g->end, g->kind);
        }
        if (segment == NULL) {
            Py_DECREF(plan);
            return NULL;
        }
        PyList_SET_ITEM(plan, i, segment);
    }
    return Py_BuildValue("(NO)", plan, deep ? Py_True : Py_False);
}

static PyObject *
csize_plan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "plan() takes exactly 5 arguments");
        return NULL;
    }
    PyObject *block = args[0];
    int is_map = PyObject_IsTrue(args[1]);
    if (is_map < 0) {
        return NULL;
    }
    State s;
    if (init_state(&s, args[2], args[3]) < 0) {
        return NULL;
    }
    Py_ssize_t limit = s.limit;
    if (!PyList_CheckExact(block) && !PyTuple_CheckExact(block)) {
        PyErr_SetString(PyExc_TypeError, "block must be a list or tuple");
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(block);
    if (n > PLAN_ELEMENTS) {
        PyErr_SetString(PyExc_ValueError, "only blocks of up to 32 elements are planned");
        return NULL;
    }
    PyObject *known = args[4];
    if (known != Py_None && (!PyTuple_CheckExact(known) || PyTuple_GET_SIZE(known) != n)) {
        known = Py_None; /* not this block's: measure everything */
    }
    PyObject **elements = PySequence_Fast_ITEMS(block);
    Segment segments[PLAN_ELEMENTS];
    Py_ssize_t count = 0;
    int deep = 0;
    Py_ssize_t run_start = -1, run_bytes = 0;
    for (Py_ssize_t idx = 0; idx < n; idx++) {
        PyObject *value = elements[idx], *key = NULL;
        if (is_map) {
            if (!PyTuple_CheckExact(value) || PyTuple_GET_SIZE(value) != 2) {
                PyErr_SetString(PyExc_TypeError, "a map's block holds (key, value) pairs");
                return NULL;
            }
            key = PyTuple_GET_ITEM(value, 0);
            value = PyTuple_GET_ITEM(value, 1);
        }
        Segment *g = &segments[count];
        Py_ssize_t size = -1, inner = -1;
        if (known != Py_None && PyLong_CheckExact(PyTuple_GET_ITEM(known, idx))) {
            size = PyLong_AsSsize_t(PyTuple_GET_ITEM(known, idx));
            if (size == -1 && PyErr_Occurred()) {
                PyErr_Clear(); /* out of range: measure it */
            }
        }
        if (size < 0) {
            if (Py_TYPE(value) == &PyUnicode_Type) {
                size = PyUnicode_GET_LENGTH(value) + 2;
            }
            else if (deep) {
                size = BIG; /* as Walker.size just below a subtree too deep for orjson */
            }
            else {
                size = measure(&s, value, g->sizes, &inner);
                if (size == DEEP) {
                    deep = 1;
                    size = BIG;
                    inner = -1;
                }
            }
        }
        if (is_map) {
            size += Py_TYPE(key) == &PyUnicode_Type ? PyUnicode_GET_LENGTH(key) : 8;
        }
        if (size > limit) {
            if (run_start >= 0) {
                /* g is the run; the element goes in the segment after it */
                Segment *r = g;
                Segment *e = &segments[count + 1];
                for (Py_ssize_t j = 0; j < inner; j++) {
                    e->sizes[j] = r->sizes[j];
                }
                set_run(r, run_start, idx);
                count++;
                g = e;
                run_start = -1;
            }
            g->start = idx;
            g->end = idx + 1;
            g->kind = size != BIG ? ALONE_BIG : ALONE;
            g->count = g->kind == ALONE_BIG ? inner : -1;
            count++;
            continue;
        }
        if (run_start >= 0 && run_bytes + size > limit) {
            set_run(g, run_start, idx);
            count++;
            run_start = -1;
        }
        if (run_start < 0) {
            run_start = idx;
            run_bytes = 0;
        }
        run_bytes += size;
    }
    if (run_start >= 0) {
        set_run(&segments[count++], run_start, n);
    }
    return build_plan(segments, count, deep);
}

static PyMethodDef csize_methods[] = {
    {"size", (PyCFunction)(void (*)(void))csize_size, METH_FASTCALL, size_doc},
    {"numbers", (PyCFunction)csize_numbers, METH_O, numbers_doc},
    {"plan", (PyCFunction)(void (*)(void))csize_plan, METH_FASTCALL, plan_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef csize_module = {
    PyModuleDef_HEAD_INIT,
    "encoder._csize",
    "The walker's size check in C (optional: the walker has a pure-Python one).",
    0,
    csize_methods,
};

PyMODINIT_FUNC
PyInit__csize(void)
{
    return PyModuleDef_Init(&csize_module);
}
