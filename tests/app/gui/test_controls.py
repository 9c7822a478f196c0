"""Controls, settings and the document pane, without a model."""

from __future__ import annotations

from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QApplication

from app.gui.main_window import MainWindow
from app.settings import AppSettings, load_settings, settings_path
from app.gui.views.controls import ControlsPanel
from engines.speculative.schedule import MAX_STEPS, PRESETS


def test_preset_and_spec_step_slider_stay_in_sync(qtbot):
    c = ControlsPanel()
    qtbot.addWidget(c)
    for name, preset in PRESETS.items():
        c.set_preset(name)
        assert c.preset == name and c.steps_slider.value() == preset.steps
    c.steps_slider.setValue(0)
    assert c.preset == "off" and c.spec_config().method == "off" and not c.spec_config().enabled
    c.steps_slider.setValue(MAX_STEPS)
    assert c.preset == "custom" and c.spec_config().steps == MAX_STEPS
    c.steps_slider.setValue(PRESETS["quality"].steps)
    assert c.preset == "quality"
    c.set_preset("off")
    assert c.steps_slider.value() == 0
    c.set_preset("lift")  # lift and balanced share a step count: the chosen one stays
    assert c.preset == "lift" and c.steps_slider.value() == PRESETS["lift"].steps


def test_engine_switch_keeps_each_engines_model_and_method(qtbot):
    c = ControlsPanel()
    qtbot.addWidget(c)
    c.set_method("draft")
    c.set_model_path("/models/chat")
    c.set_engine("ocr")
    assert [c.method_combo.itemData(i) for i in range(c.method_combo.count())] == ["mtp"]
    c.set_model_path("/models/ocr")
    c.set_engine("chat")
    assert c.method == "draft" and c.model_path() == "/models/chat"
    c.set_engine("ocr")
    assert c.model_path() == "/models/ocr" and c.engine_options() == {"runtime": "torch"}


def test_settings_persist_across_launches(qtbot):
    first = MainWindow(load_settings(), persist=True)
    qtbot.addWidget(first)
    c = first.controls
    c.set_engine("ocr")
    c.task_combo.setCurrentIndex(c.task_combo.findData("table"))
    c.set_engine("chat")
    c.set_method("ngram")
    c.set_preset("quality")
    c.temperature_spin.setValue(0.7)
    c.max_tokens_spin.setValue(333)
    c.system_edit.setPlainText("talk like a pirate")
    first.close()
    assert settings_path().exists()

    second = MainWindow(load_settings(), persist=False)
    qtbot.addWidget(second)
    c2 = second.controls
    assert c2.engine == "chat" and c2.method == "ngram"
    assert c2.preset == "quality" and c2.steps_slider.value() == PRESETS["quality"].steps
    assert c2.temperature_spin.value() == 0.7 and c2.max_tokens_spin.value() == 333
    assert c2.system_edit.toPlainText() == "talk like a pirate"
    assert c2.task_combo.currentData() == "table"


def test_the_regions_read_together_are_an_ocr_setting_that_persists(qtbot):
    """Read together (the CLI's --max-batch, 8 by default) is a row of OCR's settings, remembered
    across launches; the page job takes it (tests/app/gui/test_layout_reading_window.py)."""
    first = MainWindow(load_settings(), persist=True)
    qtbot.addWidget(first)
    c = first.controls
    c.set_engine("ocr")
    assert c.model_form.isRowVisible(c.batch_spin) and c.max_batch == 8
    c.batch_spin.setValue(3)
    c.set_engine("chat")
    assert not c.model_form.isRowVisible(c.batch_spin)
    first.close()

    second = MainWindow(load_settings(), persist=False)
    qtbot.addWidget(second)
    assert second.controls.max_batch == 3 and second.settings.ocr_max_batch == 3


def test_a_broken_settings_file_falls_back_to_defaults():
    settings_path().parent.mkdir(parents=True, exist_ok=True)
    settings_path().write_text("{not json")
    assert load_settings() == AppSettings()
    settings_path().write_text('{"steps": 5, "unknown_key": 1}')
    assert load_settings().steps == 5


def test_document_pane_paste_zoom_fit_and_pages(qtbot, tmp_path):
    window = MainWindow(AppSettings(), persist=False)
    qtbot.addWidget(window)
    window.resize(1200, 800)
    window.show()
    image = QImage(400, 300, QImage.Format.Format_RGB32)
    image.fill(QColor("#336699"))
    QApplication.clipboard().setImage(image)
    window.paste()
    doc = window.document
    assert window.controls.engine == "ocr" and len(doc.pages) == 1
    assert QImage(doc.current_image()).size() == image.size()  # saved as a PNG the engine can read
    fitted = doc.view.zoom
    doc.view.zoom_by(2.0)
    assert abs(doc.view.zoom - 2 * fitted) < 1e-6 and not doc.view.fitting
    doc.view.fit()
    assert abs(doc.view.zoom - fitted) < 1e-6
    other = tmp_path / "b.png"
    image.save(str(other))
    assert doc.add_images([str(other), str(tmp_path / "missing.png")]) == 1
    assert doc.index == 1 and doc.page_label.text() == "2 / 2"
    doc.previous_page()
    assert doc.index == 0
