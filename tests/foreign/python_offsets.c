/* Prints the CPython structure offsets the preload's Python frame walk uses
 * (probes/preload/src/python.rs `layout`), from the installed headers of one version. Compiled
 * for x86-64 and for aarch64 (run under qemu) by python_offsets.sh: the two must print the same
 * numbers, which is what lets the one table serve both architectures. */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_MINOR_VERSION >= 11
#include "internal/pycore_frame.h"
#else
#include <frameobject.h>
#endif

#define P(expr) printf("%s %zu\n", #expr, (size_t)(expr))

int main(void) {
    printf("python 3.%d\n", PY_MINOR_VERSION);
    P(offsetof(PyObject, ob_type));
    P(offsetof(PyASCIIObject, length));
    P(sizeof(PyASCIIObject));
    P(offsetof(PyCompactUnicodeObject, utf8_length));
    P(offsetof(PyCompactUnicodeObject, utf8));
    P(sizeof(PyCompactUnicodeObject));
    P(offsetof(PyCodeObject, co_filename));
    P(offsetof(PyCodeObject, co_name));
#if PY_MINOR_VERSION == 10
    P(offsetof(PyThreadState, frame));
    P(offsetof(PyFrameObject, f_back));
    P(offsetof(PyFrameObject, f_code));
    P(offsetof(PyFrameObject, f_lasti));
#else
    P(offsetof(PyCodeObject, co_code_adaptive));
    P(offsetof(PyCodeObject, _co_firsttraceable));
    P(offsetof(_PyInterpreterFrame, previous));
    P(offsetof(_PyInterpreterFrame, owner));
#if PY_MINOR_VERSION <= 12
    P(offsetof(PyThreadState, cframe));
    P(offsetof(_PyCFrame, current_frame));
    P(offsetof(_PyInterpreterFrame, prev_instr));
    P(offsetof(_PyInterpreterFrame, f_code));
#else
    P(offsetof(PyThreadState, current_frame));
    P(offsetof(_PyInterpreterFrame, instr_ptr));
    P(offsetof(_PyInterpreterFrame, f_executable));
#endif
#endif
    return 0;
}
