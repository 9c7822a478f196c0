"""pytest fixtures around the loopback hub. Import them into a test module:

    from tests.hub.fixtures import hub, hub_env  # noqa: F401  (pytest fixtures)

    def test_something(hub, hub_env):
        hub.serve_repo("org/name", folder)              # a folder of real-format files
        path = download("org/name")                     # app.models, through huggingface_hub

`hub_env` points huggingface_hub at the server (HF_ENDPOINT), switches telemetry and Xet off,
turns the suite's offline mode off, and gives each test its own HF_HOME, token-less login
state and SPECSCOPE_MODELS_DIR; `hub_env.subprocess_env()` is the same for a child process
(`specscope models get ...`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hub.server import TOKEN, HubServer

# huggingface_hub reads these environment variables once, when it is imported (the suite
# imports it early with HF_HUB_OFFLINE=1). For this process they are set on its `constants`
# module as well, which is what the environment variable would have done at import time.
_IMPORT_TIME_CONSTANTS = {
    "HF_HUB_OFFLINE": False,
    "HF_HUB_DISABLE_TELEMETRY": True,
    "HF_HUB_DISABLE_XET": True,
}


@dataclass
class HubEnv:
    endpoint: str
    hf_home: Path
    models_dir: Path
    token: str = TOKEN

    def subprocess_env(self, token: bool = False) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
        env |= {"HF_ENDPOINT": self.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1",
                "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", "HF_HOME": str(self.hf_home),
                "SPECSCOPE_MODELS_DIR": str(self.models_dir)}
        if token:
            env["HF_TOKEN"] = self.token
        return env


@pytest.fixture
def hub():
    server = HubServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hub_env(hub, tmp_path, monkeypatch) -> HubEnv:
    from huggingface_hub import constants

    env = HubEnv(endpoint=hub.url, hf_home=tmp_path / "hf_home", models_dir=tmp_path / "models")
    for key, value in env.subprocess_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    for name, value in _IMPORT_TIME_CONSTANTS.items():
        monkeypatch.setattr(constants, name, value)
    monkeypatch.setattr(constants, "HF_HOME", str(env.hf_home))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(env.hf_home / "token"))  # no stored login
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(env.hf_home / "stored_tokens"))
    return env
