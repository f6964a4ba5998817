"""luce_matmul_params (cuda/luce_ops_weights.h) as a ctypes struct, for the emulated matmul tests."""
import ctypes as C

_P = C.c_void_p


class MatmulParams(C.Structure):
    _fields_ = ([(f, _P) for f in "x w bias y workspace".split()]
                + [(f, C.c_int64) for f in "workspace_bytes rows n k".split()]
                + [(f, C.c_int32) for f in "qtype path flags tune".split()])
