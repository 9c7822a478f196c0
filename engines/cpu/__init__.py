"""The CPU room: what adapts MLX's and torch's CPU backends to decoding, on Linux only.

- `blas`: which BLAS MLX multiplies with (the wheel's OpenBLAS, the system's, or MLX's own),
  found before anything is loaded; `preload` puts it in LD_PRELOAD and re-executes once.
- `torch_blas`: torch keeps its own BLAS when a system OpenBLAS is preloaded for MLX.
- `kernels`: attention and SwiGLU with exp as a power of two (MLX's CPU exp is scalar).
- `numpy_ops`: the drafter training step's exponentials through numpy.

One switch turns all of it off: SPECSCOPE_FAST_CPU=0 runs MLX and torch as their wheels ship
them (slower, never less correct). macOS never loads any of it: Metal and Accelerate are
MLX's and torch's own there. docs/architecture.md, "The CPU room", says what each part is
measured to buy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return sys.platform == "linux" and environ.get("SPECSCOPE_FAST_CPU", "1") != "0"
