# Shared by luce/_cuda.pyx and every luce/_cuda_<family>.pyx (`include "_cuda_load.pxi"`):
# opening the kernel library and resolving its entry points, with errors that name the fix.
# An include, not an extension: setup.py builds only luce/_cuda*.pyx.
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlerror, dlopen, dlsym

REBUILD_HINT = "rebuild with 'python setup.py build_ext --inplace'"


cdef void *_open_library(str path) except NULL:
    """dlopen the kernel library at `path`; OSError with the loader's reason if it cannot."""
    cdef void *handle = dlopen(path.encode(), RTLD_NOW | RTLD_LOCAL)
    if handle == NULL:
        raise OSError(f"cannot load kernel library {path}: {dlerror().decode(errors='replace')}")
    return handle


cdef void *_symbol(void *handle, str path, str name) except NULL:
    """Address of entry point `name` in the library `handle` opened from `path`."""
    cdef void *sym = dlsym(handle, name.encode())
    if sym == NULL:
        raise OSError(f"kernel library {path} lacks symbol {name}: {REBUILD_HINT}")
    return sym


cdef int _require_loaded(const void *entry) except -1:
    """RuntimeError naming this module while `entry` is unresolved. load() resolves the entry
    point its wrappers check here last, so a load that fails halfway leaves it unloaded."""
    if entry == NULL:
        raise RuntimeError(f"{__name__} is not loaded: call luce.ops.native.load_kernels() first")
    return 0
