"""Issue 26 in the window, on real tiny engines: Auto and Compose with n-gram reach the engine
(the rounds it made show k moving and both sources drafting), the transcript colours each
accepted draft by its source and the position plot splits by it; Tune… writes the profile the
next Auto run reads (the run says so, and draws the profile's break-even acceptance), a run
without a usable profile offers Tune… in one line, cancel leaves no profile and no thread, and
a failure is one line in the dialog."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.gui.tuning import TuneSettings
from app.records.round_series import ROLLING, finite_rolling_mean
from app.gui.views.transcript import DRAFT_BG, NGRAM_BG
from app.settings import AppSettings, profiles_dir
from engines.profiles import Profile
from engines.speculative.tuning import best_k, break_even
from tests.app.conftest import Recorder, chat_settings
from tests.app.engine_loaders import cheap
from tests.app.gui.test_chat_window import run_and_wait
from tests.app.gui.test_layout import layout_problems, styled  # noqa: F401 (styled: a fixture, the app's style sheet)
from tests.engines.chat import load_chat

COPY = "the cat is big and the dog is small . the cat is big and the dog is small ."
RUN_TIMEOUT_MS = 120_000
QUICK_TUNE = TuneSettings(max_tokens=24, context=64, reps=3, prompts=[COPY, "hello world hello world"])


@pytest.fixture(scope="module")
def trained_pair(tiny_chat):
    """The tiny target, a drafter trained on it (tests/engines/training/trained.py, cached) and
    a prompt on which n-gram and the drafter both have drafts accepted."""
    from tests.engines.mlx_chat.checkpoints import WORDS
    from tests.engines.training.trained import trained_drafter

    target, _ = tiny_chat
    engine = load_chat(str(target))
    return engine.model_path, trained_drafter(engine, target, WORDS), "the cat"




def drafted_backgrounds(transcript) -> list[tuple[str | None, set[str]]]:
    """Per round with accepted drafts: its draft_source and the backgrounds its drafted characters carry."""
    doc = transcript.edit.document()
    out = []
    for span in transcript.spans:
        if not span.burst.spans:
            continue
        colours = set()
        for start, end in span.burst.spans:
            for pos in range(span.start + start, span.start + end):
                cursor = transcript.edit.textCursor()
                cursor.setPosition(pos + 1)  # the format of the character before the cursor
                colours.add(cursor.charFormat().background().color().name())
        out.append((span.burst.round.draft_source, colours))
    return out


def test_compose_reaches_the_engine_and_each_draft_is_shown_by_its_source(qtbot, tiny_chat, trained_pair):
    """Fixed k and flat prices (Auto's choices and the chooser's drafting prices follow this
    machine's clock; tested below and in tests/engines/training/test_composed.py): at T=0 the
    composed run is the same every time, and on this prompt both sources have drafts accepted."""
    from app.gui.main_window import MainWindow
    from tests.app.engine_loaders import load_with_flat_compose_prices

    _target, drafter, prompt = trained_pair
    window = MainWindow(chat_settings(tiny_chat, chat_method="mtp", draft_model=str(drafter), steps=3,
                                      compose_ngram=True, max_tokens=64),
                        engine_loader=load_with_flat_compose_prices, persist=False)
    qtbot.addWidget(window)
    window.show()
    window.ensure_telemetry()
    try:
        assert window.controls.compose_check.isVisible()
        rec = Recorder(window)
        window.chat.prompt.setPlainText(prompt)
        with qtbot.waitSignal(window.run_started) as started:
            run_and_wait(qtbot, window)
        spec = started.args[0].request.spec
        assert spec.compose_ngram and not spec.auto

        decode = [r for r in rec.rounds if not r.prefill]
        sources = {r.draft_source for r in decode if r.accepted}
        assert "ngram" in sources and sources & {"mtp", "mtp+ngram"} and sources <= {"ngram", "mtp", "mtp+ngram"}

        # the transcript: n-gram drafts blue, the drafter's green (a chain with n-gram tokens
        # after it too), exactly as the rounds say
        shown = drafted_backgrounds(window.transcript)
        assert {source for source, _ in shown} == sources
        for source, colours in shown:
            assert colours == {(NGRAM_BG if source == "ngram" else DRAFT_BG).name()}, source
        assert window.transcript.ngram_swatch.isVisibleTo(window.transcript)

        # the position plot split by source (n-gram first), each source's bars its own rounds'
        telemetry = window.telemetry
        telemetry.refresh(force=True)
        assert telemetry.legend_names()["position"] == ["n-gram", "MTP drafter"]
        def drafted_by(r, j: int) -> str:  # who drafted position j of round r ("mtp+ngram": the chain first)
            model, _, after = r.draft_source.partition("+")
            return after if after and j >= r.steps else model

        for source in ("ngram", "mtp"):
            flags = [(j, f) for r in decode if r.draft_source for j, f in enumerate(r.accept_flags)
                     if drafted_by(r, j) == source]
            reached = [sum(1 for j, _ in flags if j == i) for i in range(7)]
            accepted = [sum(f for j, f in flags if j == i) for i in range(7)]
            expected = [100 * a / n for a, n in zip(accepted, reached) if n]
            assert np.allclose(telemetry.source_bars[source].opts["height"], expected), source
        assert len(telemetry.bars.opts["height"]) == 0  # the pooled bars give way to the split
    finally:
        window.shutdown()


def test_auto_and_compose_are_kept_in_the_settings(qtbot, make_window):
    window = make_window(steps_auto=True, compose_ngram=True)
    c = window.controls
    assert c.auto_check.isChecked() and c.compose_check.isChecked()
    assert not c.steps_slider.isEnabled() and c.steps_label.text() == "auto"
    saved = AppSettings()
    c.store_settings(saved)
    assert saved.steps_auto is True and saved.compose_ngram is True
    c.auto_check.setChecked(False)
    c.compose_check.setChecked(False)
    c.store_settings(saved)
    assert saved.steps_auto is False and saved.compose_ngram is False
    assert c.steps_slider.isEnabled() and not c.spec_config().auto
    c.set_method("ngram")  # composing needs a model drafter: neither shown nor sent
    assert not c.compose_check.isVisibleTo(c) and not c.spec_config().compose_ngram


def height_fits(label) -> bool:
    """A word-wrapped label is as tall as its lines at its width (layout_problems checks one-line labels)."""
    return label.height() >= label.heightForWidth(label.width())


def auto_run(qtbot, window) -> Recorder:
    rec = Recorder(window)
    window.chat.prompt.setPlainText(COPY)
    run_and_wait(qtbot, window)
    assert rec.outcomes == ["finished"]
    return rec


def tuning_notes(rounds) -> list[str]:
    return [r.note for r in rounds if r.note and "tuning profile" in r.note]


def test_tune_writes_the_profile_the_next_auto_run_uses(qtbot, make_window):
    from engines.speculative.replay import Rounds
    from tests.app.engine_loaders import load_with_cheap_rounds

    # the runs' rounds cost what `cheap` says (Tune… measures this machine): Auto's choices then
    # follow what the runs show at T=0, the same on every machine -- priced by this machine's
    # clock, k sat between near-equal choices, and moved in one run and not the next (CI failed)
    window = make_window(engine_loader=load_with_cheap_rounds, chat_method="ngram", steps_auto=True, max_tokens=40)
    window.tuner.settings = QUICK_TUNE

    # no profile yet: the run says so once and offers Tune… above the conversation (not modal)
    rec = auto_run(qtbot, window)
    assert len(tuning_notes(rec.rounds)) == 1
    offer = window.tuner.offer
    assert offer.isVisibleTo(window) and "not tuned on this machine" in offer.label.text()
    assert "no tuning profile" in offer.label.toolTip()  # the engine's own line
    assert offer.action_button.text() == "Tune\u2026"
    assert window.telemetry.tuning_label.text().startswith("Auto \u00b7 no tuning profile")
    assert window.telemetry.break_even is None

    with qtbot.waitSignal(window.tuner.finished, timeout=RUN_TIMEOUT_MS) as tuned:
        offer.action_button.click()
    path = tuned.args[0]
    assert not offer.isVisibleTo(window)
    assert window.tuner.dialog.stage.text() == "Done" and path in window.tuner.dialog.detail.text()
    assert layout_problems(window.tuner.dialog) == [] and height_fits(window.tuner.dialog.detail)
    assert [str(p) for p in profiles_dir().iterdir()] == [path]
    saved = json.loads(open(path).read())
    profile = Profile.load(path, saved["model"], "ngram")

    # the next Auto run reads it: no note, Auto chooses from the first decode round on, and the
    # window says which profile it used and draws its break-even acceptance
    rec = auto_run(qtbot, window)
    assert tuning_notes(rec.rounds) == []
    assert not offer.isVisibleTo(window)
    decode = [r for r in rec.rounds if not r.prefill]
    assert decode[0].expected_tok_s is not None  # a profile: no rounds of measuring first
    telemetry = window.telemetry
    assert telemetry.tuning_label.text().startswith("Auto \u00b7 tuning profile of")
    assert telemetry.profile == profile
    telemetry.refresh(force=True)
    # the break-even line: at the k of the last round Auto drafted in (else the profile's best)
    drafted = [r.steps for r in decode if r.expected_tok_s and r.steps]
    latency = profile.latency().at
    k = drafted[-1] if drafted else max(1, best_k(latency, profile.draft_s, profile.acceptance, 7))
    value = break_even(latency, profile.draft_s, k)
    assert telemetry.break_even == (k, value)
    level = 100 * (value if value is not None else 1.0)
    assert list(telemetry.break_even_curve.yData) == pytest.approx([level, level])
    assert telemetry.legend_names()["position"][-1] in (f"break-even k={k}", f"k={k} never pays")

    # a profile that expected verifying wide to cost little and nearly every draft to hold (n-gram:
    # its calibration set's replayed rounds kept every draft at every k): Auto starts at the
    # deepest k and comes down as the run's own rounds show the drafts failing
    every_draft_held = Rounds(7)
    for k in range(8):
        every_draft_held.add(k, 1 + k, 1 + k)
    hopeful = Profile(**{**saved, "target_s": {w: cheap(w) for w in range(1, 9)},
                         "acceptance": [0.99] * len(saved["acceptance"]), "replayed": every_draft_held.record()})
    hopeful.save(path)
    rec = auto_run(qtbot, window)
    decode = [r for r in rec.rounds if not r.prefill]
    auto = [r for r in decode if r.expected_tok_s]
    assert auto[0].steps == window.controls.spec_config().max_steps  # the request's auto reached the engine
    assert auto[-1].steps < auto[0].steps  # and k moved with what the run showed
    telemetry.refresh(force=True)
    assert np.nansum(telemetry.steps_curve.yData) == sum(r.steps for r in auto)
    assert len(telemetry.expected_speed.yData) == len(auto)
    expected = telemetry.series.column("expected_tokens")  # E[accepted + 1 | k] of each round Auto chose
    assert list(expected[np.isfinite(expected)]) == [r.expected_tokens[r.steps] for r in auto]
    assert np.allclose(telemetry.expected_accepted.yData, finite_rolling_mean(expected, ROLLING) - 1, equal_nan=True)
    legends = telemetry.legend_names()
    assert legends["drafts"] == ["asked", "accepted", "k", "expected"]
    assert legends["speed"] == ["tok/s", "expected"]

    # a corrupt profile is ignored with one line, and Tune… offered again
    open(path, "w").write("{not json")
    rec = auto_run(qtbot, window)
    assert len(tuning_notes(rec.rounds)) == 1
    assert offer.isVisibleTo(window) and "unreadable" in offer.label.text()
    assert telemetry.break_even is None


def test_cancelling_tune_leaves_no_profile_and_no_thread(qtbot, make_window):
    window = make_window(chat_method="ngram")
    window.tuner.settings = TuneSettings(max_tokens=400, context=64, reps=3, prompts=[COPY] * 50)
    window.chat.prompt.setPlainText(COPY)
    stages = []
    window.tuner.progressed.connect(lambda p: stages.append(p.phase))
    with qtbot.waitSignal(window.tuner.started):
        assert window.tune()
    thread = window.tuner.jobs.thread
    qtbot.waitUntil(lambda: "acceptance" in stages, timeout=RUN_TIMEOUT_MS)  # mid-calibration
    assert "latency" in stages
    assert not window.run()  # no run beside the measurement
    assert "Tune" in window.transcript.message_text
    with qtbot.waitSignal(window.tuner.cancelled, timeout=RUN_TIMEOUT_MS):
        window.tuner.dialog.cancel_button.click()
    qtbot.waitUntil(lambda: not thread.isRunning(), timeout=RUN_TIMEOUT_MS)
    assert not window.tuner.running and window.tuner.dialog.stage.text() == "Cancelled"
    assert not profiles_dir().exists() or list(profiles_dir().iterdir()) == []
    assert window.run()  # runs go again
    with qtbot.waitSignal(window.run_ended, timeout=RUN_TIMEOUT_MS):
        pass


def test_a_tune_that_fails_says_why_in_one_line(qtbot, make_window, tmp_path):
    window = make_window(chat_method="ngram")
    window.controls.set_model_path(str(tmp_path / "no-such-model"))
    with qtbot.waitSignal(window.tuner.errored, timeout=RUN_TIMEOUT_MS) as failed:
        assert window.tune()
    dialog = window.tuner.dialog
    assert dialog.stage.text() == "Failed" and dialog.error.isVisibleTo(dialog)
    assert dialog.error.text() == failed.args[0] and "\n" not in failed.args[0]
    assert not window.tuner.running
    window.controls.set_engine("ocr")  # OCR is not tuned: said, nothing started
    assert not window.tune() and "chat models" in dialog.error.text()


@pytest.mark.parametrize("width", [1100, 1440])
def test_the_new_controls_and_lines_fit_at_1100_and_1440_px(qtbot, tiny_chat, trained_pair, styled, width,
                                                             specscope_home):
    """After a composed Auto run with a profile (k chosen, expected, break-even, split bars,
    n-gram swatch) and one without (the offer): nothing overlaps, lies outside its parent or is
    cut short. The screenshot is kept (SPECSCOPE_SHOTS=folder keeps it outside the test's home)."""
    import os
    import shutil

    from app.gui.main_window import MainWindow
    from engines.profiles import machine_id, profile_file
    from tests.app.gui.test_layout import settled_at

    target, drafter, prompt = trained_pair
    window = MainWindow(chat_settings(tiny_chat, chat_method="mtp", draft_model=str(drafter), steps_auto=True,
                                      compose_ngram=True, max_tokens=48), persist=False)
    qtbot.addWidget(window)
    window.show()
    window.ensure_telemetry()
    try:
        path = profile_file(profiles_dir(), target, "mtp", str(drafter))
        Profile(machine=machine_id(), model=target, method="mtp", drafter=str(drafter),
                target_s={w: 0.01 * (1 + 0.05 * w) for w in range(1, 9)}, draft_s=0.0,
                acceptance=[0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2]).save(path)
        window.controls.compose_check.setChecked(False)
        window.controls.steps_slider.setValue(3)
        window.controls.auto_check.setChecked(False)
        window.chat.prompt.setPlainText(prompt)
        run_and_wait(qtbot, window)  # a plain drafter run, then a composed one: both sources in the text
        window.controls.compose_check.setChecked(True)
        window.chat.prompt.setPlainText(prompt)
        run_and_wait(qtbot, window)
        assert window.transcript.ngram_swatch.isVisibleTo(window.transcript)
        window.controls.auto_check.setChecked(True)
        path.unlink()
        window.chat.prompt.setPlainText(prompt)
        run_and_wait(qtbot, window)  # Auto without a profile: the offer
        assert window.tuner.offer.isVisibleTo(window)
        settled_at(window, width, 860)
        window.telemetry.refresh(force=True)
        problems = layout_problems(window)
        assert problems == [], f"at {width} px:\n" + "\n".join(problems)
        assert window.controls.auto_check.isVisible() and window.controls.tune_button.isVisible()
        for w in (window.controls.auto_check, window.controls.tune_button, window.controls.compose_check):
            assert w.width() >= w.minimumSizeHint().width(), w.text()
        shot = specscope_home / f"tuning-{width}.png"
        assert window.grab().save(str(shot))
        if os.environ.get("SPECSCOPE_SHOTS"):
            shutil.copy(shot, os.environ["SPECSCOPE_SHOTS"])
    finally:
        window.shutdown()
