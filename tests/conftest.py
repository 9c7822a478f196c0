"""Suite-wide settings: offline, deterministic thread counts, offscreen Qt.

Thread counts: on a 2-core machine torch's intra-op threading makes small ops up to hundreds
of times slower, so tests run torch single-threaded."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The model manager's folder (downloads, leases, user entries): never the user's own.
if "SPECSCOPE_MODELS_DIR" not in os.environ:
    os.environ["SPECSCOPE_MODELS_DIR"] = tempfile.mkdtemp(prefix="specscope-test-models-")
    atexit.register(shutil.rmtree, os.environ["SPECSCOPE_MODELS_DIR"], True)

# scripts/test preloads the BLAS as the app does; torch keeps its own BLAS as in the app
from engines.cpu.torch_blas import keep_torch_on_its_own_blas  # noqa: E402

keep_torch_on_its_own_blas()

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # torch is only in the `convert` extra
    pass


def pytest_addoption(parser):
    parser.addoption("--bundle", action="store_true",
                     help="also build the one-folder app with PyInstaller and run it (minutes; .ci/run does)")
    parser.addoption("--slow", action="store_true",
                     help="also run the `slow` tests: real small models, many-run sampling proofs, "
                          "trained drafters, a whole Core ML conversion (tens of minutes)")
    parser.addoption("--alone", choices=("include", "exclude", "only"), default="include",
                     help="the tests marked `alone` (they measure time): run them too (the default), "
                          "leave them out, or run only them. scripts/test runs the rest on every "
                          "core, then these in one process with nothing beside them")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """The `alone` part of scripts/test writes its JUnit report beside the rest's, not over it."""
    xml = getattr(config.option, "xmlpath", None)
    if xml and config.getoption("alone") == "only":
        path = Path(xml)
        config.option.xmlpath = str(path.with_name(f"{path.stem}-alone{path.suffix}"))


# Opt-in markers: what each needs on the command line, and the reason a quick run shows when skipping.
OPT_IN = {
    "bundle": ("--bundle", "builds the app with PyInstaller (minutes): run with --bundle, as .ci/run does"),
    "slow": ("--slow", "slow (real models, many-run sampling proofs, training): run with --slow"),
}


# The order the suite's workers (pytest-xdist, scripts/test) take files in, so that they finish
# together rather than one of them starting a long file last: these first, the longest first,
# then the files with the most tests (xdist's own order, which these would come last in).
LONGEST_FIRST = (
    "tests/engines/training/test_smollm2_drafter.py",  # 15 min alone on the faster EPYCs; 72.5 on an AVX2 one beside a worker
    "tests/packaging/test_one_folder_build.py",  # the bundle (--bundle): PyInstaller for minutes
)


def pytest_collection_modifyitems(config, items):
    from collections import Counter

    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    tests = Counter(item.nodeid.split("::")[0] for item in items)
    items.sort(key=lambda item: (rank.get(path := item.nodeid.split("::")[0], len(rank)), -tests[path]))  # stable

    alone = config.getoption("alone")
    if alone != "include":
        chosen = [("alone" in item.keywords) == (alone == "only") for item in items]
        config.hook.pytest_deselected(items=[item for item, keep in zip(items, chosen) if not keep])
        items[:] = [item for item, keep in zip(items, chosen) if keep]

    for marker, (option, reason) in OPT_IN.items():
        if config.getoption(option):
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


def pytest_runtest_setup(item):
    """CI's clock (.ci/run sets SPECSCOPE_SLOW_DEADLINE, seconds since the epoch): a slow test
    that would start after it skips, saying so, so that a machine slower than planned for still
    ends CI within its 90 minutes with every quick test run. Unset, nothing is skipped."""
    import time

    deadline = os.environ.get("SPECSCOPE_SLOW_DEADLINE")
    if deadline and "slow" in item.keywords and time.time() > float(deadline):
        pytest.skip("slow: CI's time ran out before this test could start (SPECSCOPE_SLOW_DEADLINE, set by .ci/run)")
