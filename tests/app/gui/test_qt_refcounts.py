"""The Qt binding keeps Python's None, True and False alive.

PySide6 6.12.0 on Python < 3.12 dropped one reference to None on every call of a Qt method
that returns nothing (one pyqtgraph axis repaint: 136 of them) and one to True/False on every
emit of a Signal(bool) to a Python slot. A long session, or the final garbage collection after
an A/B compare, then ended in "Fatal Python error: none_dealloc". pyproject.toml keeps that
release out on those Pythons; this test fails if a binding that leaks comes back.
"""

import sys

import pytest
from PySide6.QtCore import QObject, Signal

CALLS = 2000


class Emitter(QObject):
    toggled = Signal(bool)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None/True/False are immortal from Python 3.12")
def test_qt_calls_and_bool_signals_keep_the_singletons_referenced():
    obj = QObject()
    before = sys.getrefcount(None)
    for _ in range(CALLS):
        obj.setObjectName("x")  # a Qt method that returns nothing
    assert sys.getrefcount(None) - before > -CALLS // 2

    received = []
    emitter = Emitter()
    emitter.toggled.connect(received.append)
    before_true = sys.getrefcount(True)
    for _ in range(CALLS):
        emitter.toggled.emit(True)
    assert len(received) == CALLS  # each holds one reference to True
    assert sys.getrefcount(True) - before_true - CALLS > -CALLS // 2
