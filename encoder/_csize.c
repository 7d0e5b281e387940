/* Estimated JSON size of plain values, in one C call: the walker's "is this small?" check.
 *
 * The pure-Python check (``Walker.size``) costs 25-45 ns a node, two to three times what
 * orjson spends writing the node; this one costs a few. It reads types and lengths only and
 * never calls back into Python (no hashing, no comparison, no attribute lookup), so the
 * values cannot change under it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

static int
add_items(State *s, PyObject **items, Py_ssize_t n, int depth)
{
    s->total += 2 + n;
    if (s->total > s->limit) {
        return 1;
    }
    Py_ssize_t start = s->total;
    Py_ssize_t i = 0;
    /* A run of numbers (token ids, logprobs) in a tight loop of its own: most elements of an
     * episode are such numbers. */
    for (; i < n; i++) {
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
add_dict(State *s, PyObject *obj, int depth)
{
    Py_ssize_t pos = 0, i = 0, n = PyDict_GET_SIZE(obj);
    PyObject *key, *value;
    s->total += 2;
    Py_ssize_t start = s->total;
    while (PyDict_Next(obj, &pos, &key, &value)) {
        if (i++ == PREFIX && n >= 4 * PREFIX && projected_past(s, start, n)) {
            return 1;
        }
        if (Py_TYPE(key) == &PyUnicode_Type) {
            s->total += PyUnicode_GET_LENGTH(key) + 4;
        }
        else {
            s->total += 24;
        }
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

static PyObject *
csize_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "size() takes exactly 3 arguments");
        return NULL;
    }
    PyObject *values = args[0];
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!PyTuple_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "leaves must be a tuple of types");
        return NULL;
    }
    State s = {0, limit, args[2]};
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
    for (Py_ssize_t i = 0; i < n; i++) {
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

static PyMethodDef csize_methods[] = {
    {"size", (PyCFunction)(void (*)(void))csize_size, METH_FASTCALL, size_doc},
    {"numbers", (PyCFunction)csize_numbers, METH_O, numbers_doc},
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
