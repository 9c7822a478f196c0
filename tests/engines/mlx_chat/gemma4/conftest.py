"""Session-wide tiny Gemma 4 checkpoints: a dense pair (31B-like target, dense-head assistant)
and an edge pair (E2B-like target with per-layer embeddings and KV sharing, centroid-head
assistant). Built once with transformers' classes, saved in HF format."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.engines.mlx_chat.gemma4.checkpoints import (
    DENSE_TARGET, EDGE_TARGET, AssistantSpec, build_assistant, build_target,
)


@dataclass(frozen=True)
class Pair:
    name: str
    target: Path
    assistant: Path


@pytest.fixture(scope="session")
def dense_pair(tmp_path_factory) -> Pair:
    root = tmp_path_factory.mktemp("gemma4_dense")
    target = build_target(root / "target", DENSE_TARGET)
    return Pair("dense", target, build_assistant(root / "assistant", target, AssistantSpec()))


@pytest.fixture(scope="session")
def edge_pair(tmp_path_factory) -> Pair:
    root = tmp_path_factory.mktemp("gemma4_edge")
    target = build_target(root / "target", EDGE_TARGET)
    return Pair("edge", target, build_assistant(root / "assistant", target, AssistantSpec(centroid=True)))


@pytest.fixture(params=["dense", "edge"])
def pair(request) -> Pair:
    return request.getfixturevalue(f"{request.param}_pair")
