/* Python's round(value, ndigits) over a slice of a list of floats, in one C call.
 *
 * verifiers rounds every per-token float of a record (logprobs, advantages, ...) with
 * ``round(v, d)`` in a Python serializer: 70-80% of ``to_record()``'s time. This gives the
 * same doubles, bit for bit, without a Python call per float (docs/design.md D16).
 *
 * CPython rounds a finite float by writing it as a decimal string correctly rounded to
 * ``ndigits`` places (round-half-even on the float's exact binary value) and reading that
 * string back as the nearest double. The fast path reaches the same double by arithmetic:
 * for 0 <= ndigits <= 22, p = 10**ndigits is exact, y = x * p is within half an ulp of the
 * exact product, so unless y lies within a few ulps of a half-integer, nearbyint(y) is the
 * integer n that the exact product rounds to, and n / p (both exact, IEEE division correctly
 * rounded) is the double nearest n / 10**ndigits: the double strtod reads back. Anything
 * else (a near-tie, |y| >= 2**51, another ndigits, a value that is not an exact float) goes
 * to Python's own ``round``, so the result is its result by construction.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                 1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
#define TWO_51 2251799813685248.0
#define TWO_M50 (1.0 / 1125899906842624.0)

/* x rounded to ``ndigits`` places by arithmetic, or -1 (nothing stored) where that could
 * differ from CPython's round. */
static int
fast_round(double x, int ndigits, double *out)
{
    if (!isfinite(x)) {
        *out = x; /* nan and infinities round to themselves */
        return 0;
    }
    double p = POW10[ndigits];
    double y = x * p;
    double a = fabs(y);
    if (!(a < TWO_51))
        return -1;
    double frac = a - floor(a);
    if (fabs(frac - 0.5) <= a * TWO_M50 + 1e-300)
        return -1; /* too near a tie to tell from the rounded product */
    *out = nearbyint(y) / p;
    return 0;
}

/* Python's round(item, ndigits) as the float pydantic writes for it, a new reference. */
static PyObject *
slow_round(PyObject *item, PyObject *py_ndigits)
{
    PyObject *rounded = PyObject_CallMethod(item, "__round__", "O", py_ndigits);
    if (rounded == NULL || PyFloat_CheckExact(rounded))
        return rounded;
    PyObject *as_float = PyNumber_Float(rounded);
    Py_DECREF(rounded);
    return as_float;
}

PyDoc_STRVAR(round_slice_doc,
"round_slice(values, start, stop, ndigits, /)\n--\n\n"
"A new list: round(v, ndigits) of each of values[start:stop], as a float (an int or bool is\n"
"converted as pydantic writes it into a float field); ndigits None: each value as a float,\n"
"not rounded. Raises TypeError on a value that is neither a float nor an int.");

static PyObject *
round_slice(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "round_slice takes 4 arguments");
        return NULL;
    }
    PyObject *values = args[0];
    if (!PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "round_slice: values must be a list");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t stop = PyLong_AsSsize_t(args[2]);
    int overflow = 0;
    int keep = args[3] == Py_None; /* no rounding: floats as they are */
    long ndigits = keep ? 0 : PyLong_AsLongAndOverflow(args[3], &overflow);
    if (PyErr_Occurred())
        return NULL;
    /* values[start:stop], as a slice reads it */
    Py_ssize_t count = PySlice_AdjustIndices(PyList_GET_SIZE(values), &start, &stop, 1);
    int fast = !overflow && ndigits >= 0 && ndigits <= 22;
    PyObject *out = PyList_New(count);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = start; i < start + count; i++) {
        PyObject *item = PyList_GET_ITEM(values, i);
        PyObject *result;
        double r;
        if (keep && PyFloat_CheckExact(item)) {
            Py_INCREF(item);
            result = item;
        } else if (keep && (PyLong_Check(item) || PyFloat_Check(item))) {
            result = PyNumber_Float(item);
        } else if (PyFloat_CheckExact(item)) {
            if (fast && fast_round(PyFloat_AS_DOUBLE(item), (int)ndigits, &r) == 0)
                result = PyFloat_FromDouble(r);
            else
                result = slow_round(item, args[3]);
        } else if (PyLong_Check(item) || PyFloat_Check(item)) {
            result = slow_round(item, args[3]);
        } else {
            PyErr_Format(PyExc_TypeError, "round_slice: %.100s is not a float",
                         Py_TYPE(item)->tp_name);
            result = NULL;
        }
        if (result == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i - start, result);
    }
    return out;
}

static PyMethodDef cround_methods[] = {
    {"round_slice", (PyCFunction)(void (*)(void))round_slice, METH_FASTCALL, round_slice_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cround_module = {
    PyModuleDef_HEAD_INIT,
    "encoder._cround",
    "round() over a slice of floats in C (optional: the walker rounds in Python without it).",
    0,
    cround_methods,
};

PyMODINIT_FUNC
PyInit__cround(void)
{
    return PyModuleDef_Init(&cround_module);
}
