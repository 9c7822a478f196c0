"""torch keeps its own BLAS when the system's OpenBLAS is preloaded for MLX.

torch carries its own BLAS (MKL, linked into libtorch_cpu), but its calls to sgemm_ / sgemv_ go
through the dynamic linker like any other, so a preloaded system OpenBLAS, which exports those
names, takes them over, and GLM-OCR's float32 decode (one row through 1536 x 9216 linears) is
slower on OpenBLAS than on MKL (docs/architecture.md, "The CPU room"). So torch's extension module is loaded with RTLD_DEEPBIND, which makes
libtorch_cpu resolve its symbols in itself first (tests/unit/test_launch.py reads the dynamic
linker's bindings to check it). The wheel's OpenBLAS exports only `cblas_sgemm` under a
standard name, which torch does not call: with it, torch is loaded as usual.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

from engines import cpu
from engines.cpu import blas


class _DeepBoundExtension(importlib.machinery.ExtensionFileLoader):
    """An extension module loaded with RTLD_DEEPBIND: it and the libraries it pulls in look up
    symbols in themselves before the process's global scope (where LD_PRELOAD puts OpenBLAS)."""

    def create_module(self, spec):
        flags = sys.getdlopenflags()
        sys.setdlopenflags(flags | os.RTLD_DEEPBIND)
        try:
            return super().create_module(spec)
        finally:
            sys.setdlopenflags(flags)


class TorchOwnBlas(importlib.abc.MetaPathFinder):
    """Finds torch._C (which loads libtorch_cpu) and has it loaded deep-bound; every other
    module is left to the usual finders. Lazy: torch is imported when OCR first needs it."""

    def find_spec(self, name, path, target=None):
        if name != "torch._C":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and type(spec.loader) is importlib.machinery.ExtensionFileLoader:
            spec.loader = _DeepBoundExtension(spec.loader.name, spec.loader.path)
        return spec


def system_openblas_preloaded() -> bool:
    system = blas.system_openblas()
    return system is not None and system in os.environ.get("LD_PRELOAD", "").split(":")


def keep_torch_on_its_own_blas() -> None:
    """Call it before anything imports torch: the entry point, the engine process and the
    tests' conftest do."""
    if not cpu.enabled() or not system_openblas_preloaded():
        return
    if "torch" in sys.modules or any(isinstance(f, TorchOwnBlas) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, TorchOwnBlas())
