"""Models › Models… › Train a drafter…: a chat model the user added (the tiny llama, real HF
layout) gets a drafter trained on a worker thread, with progress (step, loss, held-out
acceptance, ETA), paired with the model so MTP finds it; Cancel keeps a resumable checkpoint.
Same trainer as `specscope drafter train` (engines/training), a few steps here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

pytest.importorskip("mlx.core")

from app.gui.model_jobs import ModelJobs  # noqa: E402
from app.gui.views.models_dialog import ModelsDialog  # noqa: E402
from app.models import catalog, lookup  # noqa: E402
from tests.engines.mlx_chat import checkpoints  # noqa: E402
from tests.engines.training.trained import write_prompts  # noqa: E402

LEFT = Qt.MouseButton.LeftButton
TIMEOUT_MS = 90_000


@pytest.fixture
def dialog(qtbot, tmp_path):
    target = checkpoints.make_tiny_llama(tmp_path / "llama")
    entry = catalog.add_user_entry(catalog.entry_for_path(target, "chat"))
    jobs = ModelJobs()
    dialog = ModelsDialog(jobs)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.train_settings = dict(minutes=None, prompts_file=str(write_prompts(tmp_path / "prompts.json", checkpoints.WORDS)),
                                 answer_tokens=40, seq_len=64, learning_rate=3e-3, save_every=10, eval_every=10)
    dialog.select(entry.id)
    yield dialog, entry, target
    jobs.shutdown()
    catalog.remove_user_entry(entry.id)
    catalog.remove_user_entry(f"drafter:{entry.id}")


def test_train_a_drafter_shows_progress_and_pairs_it(qtbot, dialog):
    dialog, entry, target = dialog
    assert dialog.train_button.isEnabled() and dialog.train_button.text() == "Train a drafter\u2026"
    dialog.train_settings["steps"] = 30
    progress = []
    dialog.jobs.progressed.connect(progress.append)
    with qtbot.waitSignal(dialog.jobs.finished, timeout=TIMEOUT_MS) as done:
        qtbot.mouseClick(dialog.train_button, LEFT)
        assert dialog.progress.isVisible() and dialog.cancel_button.isEnabled() and not dialog.train_button.isEnabled()
    model_id, out = done.args
    assert model_id == entry.id and json.loads((Path(out) / "card.json").read_text())["training"]["steps"] == 30
    trained = [p for p in progress if p.phase == "train" and "held-out acceptance d1" in p.text]
    assert trained and trained[-1].fraction == 1.0 and "ETA" in trained[-1].text
    assert "is ready" in dialog.message.text() and not dialog.progress.isVisible()
    assert lookup.paired_drafter(str(target)) == out  # --spec mtp on this model finds it


def test_cancel_keeps_a_checkpoint_and_training_again_resumes(qtbot, dialog):
    dialog, entry, _ = dialog
    dialog.train_settings["steps"] = 100_000
    from app.models import store

    ckpt = store.models_dir() / "drafters" / store.safe_name(entry.id) / "checkpoint" / "state.json"

    def cancel_after_a_checkpoint(p):
        if ckpt.is_file():
            dialog.cancel_button.click()

    dialog.jobs.progressed.connect(cancel_after_a_checkpoint)
    with qtbot.waitSignal(dialog.jobs.cancelled, timeout=TIMEOUT_MS):
        qtbot.mouseClick(dialog.train_button, LEFT)
    dialog.jobs.progressed.disconnect(cancel_after_a_checkpoint)
    assert "checkpoint is kept" in dialog.message.text()
    stopped_at = json.loads(ckpt.read_text())["step"]
    assert 10 <= stopped_at < 100_000
    dialog.train_settings["steps"] = stopped_at + 5
    with qtbot.waitSignal(dialog.jobs.finished, timeout=TIMEOUT_MS):
        qtbot.mouseClick(dialog.train_button, LEFT)
    assert json.loads(ckpt.read_text())["step"] == stopped_at + 5  # resumed, not restarted
