"""Makes docs/screenshots/ocr-layout-regions-1280x800.png: a page read by region in the window,
taken mid-read (boxes waiting, reading and done, their live drafts, the batch under the page, the
Markdown so far). The models are tiny checkpoints in the real formats, put in a temporary models
folder as `specscope models get` installs them (a snapshot and its install record):

    xvfb-run -a -s "-screen 0 1280x800x24" python docs/screenshots/layout_reading.py [WORK_DIR]

The page is tests/engines/glm_ocr/layout_checkpoints.layout_page(), the layout model that file's
"regions" checkpoint (random: two overlapping boxes), and GLM-OCR the tests' tiny checkpoint with
its MTP layer trained on the target's own outputs for the regions' crops, so drafts are accepted
as on the real model; its text is byte soup."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIZE = (1280, 800)
SHOT_AT_STEP = 60  # at the latest; first choice: as soon as a region is read while another still reads


def install(model_id: str, folder: Path) -> None:
    """The snapshot and install record `models get` leaves (app/models/store.py)."""
    from app.models import catalog, store

    repo = catalog.find(model_id).repo_id
    snapshot = store.repo_cache_dir(repo) / "snapshots" / ("0" * 40)
    shutil.copytree(folder, snapshot, dirs_exist_ok=True)
    files = {p.relative_to(snapshot).as_posix(): p.stat().st_size for p in snapshot.rglob("*") if p.is_file()}
    store.write_record(store.InstallRecord(repo, "0" * 40, files))


def checkpoints(work: Path) -> tuple[Path, Path, Path]:
    """(GLM-OCR, layout model, page), built once in `work`."""
    sys.path.insert(0, str(ROOT))
    from PIL import Image

    from engines.glm_ocr.document import crop_region
    from engines.glm_ocr.layout import LayoutModel
    from tests.engines.glm_ocr.checkpoints import make_tiny_glm_ocr, train_mtp_on_target
    from tests.engines.glm_ocr.layout_checkpoints import layout_page, make_tiny_layout

    glm, layout, page = work / "glm-ocr", work / "layout", work / "page.png"
    if not (work / "trained").exists():
        image = layout_page(page)
        make_tiny_layout(layout)
        regions = LayoutModel.load(layout).regions(image)
        crops = [Image.open(crop_region(image, r, work / f"crop-{r.index}.png")[0]).convert("RGB") for r in regions]
        make_tiny_glm_ocr(glm)
        train_mtp_on_target(glm, crops, steps=40, max_new_tokens=96)
        (work / "trained").touch()
    return glm, layout, page


def main() -> None:
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="specscope-layout-shot-"))
    work.mkdir(parents=True, exist_ok=True)
    glm, layout, page = checkpoints(work)
    out = ROOT / "docs" / "screenshots" / "ocr-layout-regions-1280x800.png"
    home = Path(tempfile.mkdtemp(prefix="specscope-layout-shot-"))
    os.environ.update(SPECSCOPE_HOME=str(home), SPECSCOPE_MODELS_DIR=str(home / "models"), HF_HUB_OFFLINE="1",
                      OMP_NUM_THREADS="1")
    install("glm-ocr", glm)
    install("pp-doclayout-v3", layout)

    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.gui.main_window import MainWindow
    from app.settings import AppSettings

    app = QApplication.instance() or QApplication(sys.argv)
    from app.gui.startup import apply_style

    apply_style(app)
    window = MainWindow(AppSettings(engine="ocr", ocr_model="", ocr_method="mtp", steps=3, preset=None,
                                    max_tokens=96, max_repeat=0), persist=False, autosave=False)
    window.resize(*SIZE)
    window.show()
    window.ensure_telemetry()
    window.open_documents([page])
    watch = QTimer()  # on the GUI thread, as everything that touches the window must be

    def shoot() -> None:
        run = window.document_run
        states = set(run.boxes[run.index].states.values()) if run.index in run.boxes else set()
        if run.batch is not None and ({"done", "reading"} <= states or len(run.batch.at) >= SHOT_AT_STEP):
            watch.stop()
            window.grab().save(str(out))
            print(out)
            window.stop()

    watch.timeout.connect(shoot)
    watch.start(20)
    window.run_ended.connect(lambda _outcome: QTimer.singleShot(200, app.quit))
    QTimer.singleShot(300, window.run)
    app.exec()
    window.shutdown()


if __name__ == "__main__":
    main()
