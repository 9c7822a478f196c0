"""`specscope --screenshot PATH --chat PROMPT --compare` as a user runs it: a separate process,
offscreen, that performs an A/B compare, saves the PNG and exits cleanly (exit code 0, no fatal
error at interpreter teardown)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[3]


PROMPT = (
    "Reformat the following notes as a bulleted list, one sentence per bullet, keeping every word:\n\n"
    "Meeting notes, Tuesday: Anna presented the quarterly budget. The team agreed to move the product "
    "launch from March to April because the supplier needs two more weeks. Ben will contact the supplier "
    "on Friday. Carla will update the marketing plan and share it with everyone by next Monday. The next "
    "meeting is on Thursday at ten o'clock in room B."
)


@pytest.mark.slow  # 23 s of SmolLM2; the bundle test (--bundle) runs a screenshot too, in CI
def test_screenshot_of_an_ab_compare_exits_cleanly(specscope_home):
    """On the embedded SmolLM2. With PySide6 6.12.0 on Python 3.11 this run crashed at teardown
    ("none_dealloc"; see test_qt_refcounts.py)."""
    shot = specscope_home / "compare.png"
    env = dict(os.environ, SPECSCOPE_HOME=str(specscope_home), QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-m", "app", "--screenshot", str(shot), "--chat", PROMPT,
         "--spec", "ngram", "--steps", "5", "--max-tokens", "160", "--compare"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Fatal Python error" not in out.stderr
    assert "outputs identical" in out.stderr
    with Image.open(shot) as image:
        assert image.size[0] >= 800 and image.size[1] >= 500
