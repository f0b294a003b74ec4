#!/usr/bin/env python3
"""DLPack round trips between ndm and NumPy (np.from_dlpack and __dlpack__),
through ctypes on the shared library: zero copy is checked by writing through
one side and reading the other, and ownership by the producer's release.

Usage: dlpack_numpy.py LIBNDM_SO. Exits 77 (skipped) when NumPy is absent."""
import ctypes as C
import gc
import sys

try:
    import numpy as np
except ImportError:
    print("SKIP: NumPy is not installed (Debian: python3-numpy)")
    sys.exit(77)

if not hasattr(np, "from_dlpack"):
    print("SKIP: NumPy %s has no from_dlpack (1.22 or later has)" % np.__version__)
    sys.exit(77)


class Handle(C.Structure):
    _fields_ = [("id", C.c_uint64)]


class Device(C.Structure):
    _fields_ = [("type", C.c_int), ("index", C.c_int)]


class Stats(C.Structure):
    _fields_ = [(n, C.c_uint64) for n in ("live_arrays", "created", "released", "moved_in",
                                          "moved_out", "live_bytes", "peak_bytes",
                                          "resources", "children")]


lib = C.CDLL(sys.argv[1])
SITE = [C.c_char_p, C.c_int, C.c_char_p]
here = (b"dlpack_numpy.py", 0, b"test")


def fn(name, res, *args):
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


ndm_system = fn("ndm_system", Handle)
ndm_detached = fn("ndm_detached", Handle)
manager_new = fn("ndm_manager_new_at", Handle, *SITE, Handle, C.c_char_p)
manager_close = fn("ndm_manager_close_at", C.c_int, *SITE, Handle)
arange = fn("ndm_arange_at", Handle, *SITE, Handle, C.c_int, C.c_double, C.c_double, C.c_double)
to_dlpack = fn("ndm_to_dlpack_at", C.c_void_p, *SITE, Handle)
from_dlpack = fn("ndm_from_dlpack_at", Handle, *SITE, Handle, C.c_void_p)
array_data = fn("ndm_array_data", C.c_void_p, Handle)
array_dtype = fn("ndm_array_dtype", C.c_int, Handle)
copy_out = fn("ndm_array_copy_out_at", C.c_int, *SITE, Handle, C.c_void_p, C.c_size_t)
add_scalar_ = fn("ndm_add_scalar_inplace_at", C.c_int, *SITE, Handle, C.c_double)
stats = fn("ndm_manager_stats", C.c_int, Handle, Device, C.c_uint, C.POINTER(Stats))
last_error = fn("ndm_last_error", C.c_char_p)

capsule_new = C.pythonapi.PyCapsule_New
capsule_new.restype = C.py_object
capsule_new.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
capsule_ptr = C.pythonapi.PyCapsule_GetPointer
capsule_ptr.restype = C.c_void_p
capsule_ptr.argtypes = [C.py_object, C.c_char_p]
capsule_rename = C.pythonapi.PyCapsule_SetName
capsule_rename.restype = C.c_int
capsule_rename.argtypes = [C.py_object, C.c_char_p]

F32, I64, F64 = 6, 3, 7
CPU = Device(0, 0)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def live(m, subtree=True):
    s = Stats()
    assert stats(m, CPU, 1 if subtree else 0, C.byref(s)) == 0
    return s.live_arrays, s.live_bytes


class Exported:
    """What np.from_dlpack consumes: an ndm array's DLPack capsule."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, stream=None, **kwargs):
        return capsule_new(self.tensor, b"dltensor", None)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


# ---- ndm -> NumPy ------------------------------------------------------------
m = manager_new(*here, ndm_system(), b"numpy-export")
a = arange(*here, m, F32, 0, 6, 1)
x = np.from_dlpack(Exported(to_dlpack(*here, a)))
check(x.dtype == np.float32 and x.shape == (6,), "ndm -> numpy: dtype float32, shape (6,)")
check(x.ctypes.data == array_data(a), "ndm -> numpy: same address (no copy)")
# NumPy before 2.1 marks what from_dlpack returns read-only: write through a
# NumPy view of the very address it reports
w = x if x.flags.writeable else np.ctypeslib.as_array((C.c_float * 6).from_address(x.ctypes.data))
w[2] = 42.0  # NumPy writes, ndm reads
del w
out = (C.c_float * 6)()
copy_out(*here, a, out, C.sizeof(out))
check(out[2] == 42.0, "ndm -> numpy: a write through numpy is read by ndm")
add_scalar_(*here, a, 1.0)  # ndm writes, NumPy reads
check(x[0] == 1.0 and x[2] == 43.0, "ndm -> numpy: a write through ndm is read by numpy")
check(live(ndm_detached()) == (1, 0), "ndm -> numpy: the export is a lent alias in 'detached'")
manager_close(*here, m)  # ndm's side closes first
check(list(x) == [1, 2, 43, 4, 5, 6], "ndm -> numpy: storage outlives the ndm manager")
check(live(ndm_detached())[1] == 24, "ndm -> numpy: the alias now holds the 24 bytes")
del x
gc.collect()
check(live(ndm_detached()) == (0, 0), "ndm -> numpy: numpy's release frees the storage")

# ---- NumPy -> ndm ------------------------------------------------------------
m = manager_new(*here, ndm_system(), b"numpy-import")
for dt, code in ((np.float32, F32), (np.float64, F64), (np.int64, I64)):
    y = np.arange(6, dtype=dt).reshape(2, 3)
    refs = sys.getrefcount(y)
    cap = y.__dlpack__()
    b = from_dlpack(*here, m, capsule_ptr(cap, b"dltensor"))
    if not b.id:
        check(False, "numpy -> ndm: import failed: %s" % last_error().decode())
        continue
    capsule_rename(cap, b"used_dltensor")  # ndm owns the tensor now
    del cap
    name = np.dtype(dt).name
    check(array_dtype(b) == code, "numpy -> ndm (%s): dtype" % name)
    check(array_data(b) == y.ctypes.data, "numpy -> ndm (%s): same address (no copy)" % name)
    y[1, 1] = 40  # NumPy writes, ndm reads
    buf = np.empty(6, dtype=dt)
    copy_out(*here, b, buf.ctypes.data, buf.nbytes)
    check(buf[4] == 40, "numpy -> ndm (%s): a write through numpy is read by ndm" % name)
    add_scalar_(*here, b, 1.0)  # ndm writes, NumPy reads
    check(y[0, 0] == 1 and y[1, 1] == 41,
          "numpy -> ndm (%s): a write through ndm is read by numpy" % name)
    check(sys.getrefcount(y) > refs, "numpy -> ndm (%s): ndm holds numpy's array" % name)
# a transposed (strided) view keeps its strides
z = np.arange(12, dtype=np.float32).reshape(3, 4).T
cap = z.__dlpack__()
b = from_dlpack(*here, m, capsule_ptr(cap, b"dltensor"))
check(b.id != 0, "numpy -> ndm: a transposed view is adopted")
if b.id:
    capsule_rename(cap, b"used_dltensor")
    buf = np.empty((4, 3), dtype=np.float32)
    copy_out(*here, b, buf.ctypes.data, buf.nbytes)
    check((buf == z).all(), "numpy -> ndm: the strided view reads as numpy's")
del cap
refs = sys.getrefcount(z)
manager_close(*here, m)  # the close calls numpy's deleter
gc.collect()
check(sys.getrefcount(z) < refs, "numpy -> ndm: closing the manager releases numpy's array")

# ---- PyTorch, when it is installed (not in CI: the note reports it) -------------
try:
    import torch
    import torch.utils.dlpack
except ImportError:
    torch = None
    print("PyTorch is not installed: its round trip is skipped")
if torch is not None:
    print("PyTorch %s" % torch.__version__)
    m = manager_new(*here, ndm_system(), b"torch-export")
    a = arange(*here, m, F32, 0, 6, 1)
    x = torch.from_dlpack(Exported(to_dlpack(*here, a)))
    check(x.dtype == torch.float32 and tuple(x.shape) == (6,), "ndm -> torch: dtype, shape")
    check(x.data_ptr() == array_data(a), "ndm -> torch: same address (no copy)")
    x[2] = 42.0
    copy_out(*here, a, out, C.sizeof(out))
    check(out[2] == 42.0, "ndm -> torch: a write through torch is read by ndm")
    add_scalar_(*here, a, 1.0)
    check(x[0].item() == 1.0 and x[2].item() == 43.0,
          "ndm -> torch: a write through ndm is read by torch")
    manager_close(*here, m)
    check(x.tolist() == [1, 2, 43, 4, 5, 6], "ndm -> torch: storage outlives the ndm manager")
    del x
    gc.collect()
    check(live(ndm_detached()) == (0, 0), "ndm -> torch: torch's release frees the storage")
    m = manager_new(*here, ndm_system(), b"torch-import")
    y = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # strided
    cap = torch.utils.dlpack.to_dlpack(y)
    b = from_dlpack(*here, m, capsule_ptr(cap, b"dltensor"))
    check(b.id != 0, "torch -> ndm: a transposed tensor is adopted")
    if b.id:
        capsule_rename(cap, b"used_dltensor")
        check(array_data(b) == y.data_ptr(), "torch -> ndm: same address (no copy)")
        y[1, 2] = 100.0
        buf = np.empty((4, 3), dtype=np.float32)
        copy_out(*here, b, buf.ctypes.data, buf.nbytes)
        check(buf[1, 2] == 100.0 and buf[3, 0] == 3.0,
              "torch -> ndm: a write through torch is read by ndm (strides kept)")
        add_scalar_(*here, b, 1.0)
        check(y[0, 0].item() == 1.0 and y[1, 2].item() == 101.0,
              "torch -> ndm: a write through ndm is read by torch")
    del cap
    manager_close(*here, m)
    check(y[1, 2].item() == 101.0, "torch -> ndm: torch's tensor lives on after the close")

check(live(ndm_system()) == (0, 0), "every manager is empty at the end")

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
