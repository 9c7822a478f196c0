"""Suite-wide settings: offline, deterministic thread counts, offscreen Qt.

Thread counts: on a 2-core machine torch's intra-op threading makes small ops up to hundreds
of times slower, so tests run torch single-threaded."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The model manager's folder (downloads, leases, user entries): never the user's own.
if "SPECSCOPE_MODELS_DIR" not in os.environ:
    os.environ["SPECSCOPE_MODELS_DIR"] = tempfile.mkdtemp(prefix="specscope-test-models-")
    atexit.register(shutil.rmtree, os.environ["SPECSCOPE_MODELS_DIR"], True)

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # torch is only in the `convert` extra
    pass
