"""Engines: everything that turns a Request into Rounds. No Qt here, and never `app` (tests/unit/
test_architecture.py holds both).

The flow of one run: a `Request` (engines.types) goes to the engine `engines.factory.load_engine`
picks, whose `generate(request)` yields one `Round` per target forward (engines.speculative.rounds).
This package's own module is only this docstring: importing a submodule loads nothing else.
"""
