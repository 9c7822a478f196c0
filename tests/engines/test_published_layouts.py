"""The repositories as they are really published, not only the tests' own fixtures: tiny random
checkpoints in the exact file layout and config form of zai-org/GLM-OCR, google/gemma-4-E2B-it
and google/gemma-4-E2B-it-assistant (tests/engines/*/checkpoints.py say where each detail comes
from), run end to end through the CLI: OCR with MTP, chat with `--spec mtp` and the assistant."""

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("mlx.core")

GLM_OCR_FILES = {"README.md", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json"}
GEMMA4_IT_FILES = {"README.md", "chat_template.jinja", "config.json", "generation_config.json",
                   "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                   "model.safetensors.index.json", "processor_config.json", "tokenizer.json",
                   "tokenizer_config.json"}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    from tests.engines.mlx_chat.gemma4.checkpoints import build_published_assistant, build_published_target
    from tests.engines.glm_ocr.checkpoints import make_published_glm_ocr
    from tests.engines.glm_ocr.checkpoints import test_images as sample_images

    root = tmp_path_factory.mktemp("published")
    page = root / "page.png"
    sample_images(1)[0].save(page)
    target = build_published_target(root / "gemma-4-E2B-it")
    return {
        "glm_ocr": make_published_glm_ocr(root / "GLM-OCR"),
        "gemma4": target,
        "assistant": build_published_assistant(root / "gemma-4-E2B-it-assistant", target),
        "page": page,
    }


def run_cli(capsys, *argv) -> dict:
    from app.cli.main import main

    rc = main(list(argv))
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def ocr(capsys, model: str | Path, page: Path, spec: str) -> dict:
    return run_cli(capsys, "ocr", str(page), "--model", str(model), "--runtime", "torch", "--spec", spec,
                   "--steps", "3", "--max-tokens", "16", "--json")


def chat(capsys, model: str | Path, assistant: str | Path | None, spec: str) -> dict:
    draft = ["--draft-model", str(assistant)] if assistant else []
    return run_cli(capsys, "chat", "--model", str(model), *draft, "--spec", spec, "--steps", "3",
                   "--prompt", "w7 w8 w9 w10", "--max-tokens", "24", "--json")


def test_glm_ocr_layout_is_the_published_one(published):
    repo = published["glm_ocr"]
    assert {p.name for p in repo.iterdir()} == GLM_OCR_FILES
    config = json.loads((repo / "config.json").read_text())
    assert config["model_type"] == "glm_ocr" and "dtype" not in config
    assert config["text_config"]["model_type"] == "glm_ocr_text"
    assert config["text_config"]["num_nextn_predict_layers"] == 1
    assert "rope_parameters" not in config["vision_config"]
    from safetensors import safe_open

    with safe_open(repo / "model.safetensors", "pt") as f:
        names = set(f.keys())
        assert str(f.get_tensor("lm_head.weight").dtype) == "torch.bfloat16"
    mtp = f"model.language_model.layers.{config['text_config']['num_hidden_layers']}."
    assert {mtp + "eh_proj.weight", mtp + "enorm.weight", mtp + "hnorm.weight",
            mtp + "shared_head.norm.weight"} <= names


def test_glm_ocr_published_ocr_with_mtp_equals_transformers(published, capsys):
    """OCR with MTP on the published layout (bf16 weights, the MTP layer as layer N) emits what
    plain decoding emits, and what transformers' own GlmOcrForConditionalGeneration emits in the
    same compute dtype."""
    import torch
    from PIL import Image
    from transformers import GlmOcrForConditionalGeneration

    from tests.engines.glm_ocr.checkpoints import hf_greedy, reference_prompt

    repo, page = published["glm_ocr"], published["page"]
    mtp, plain = ocr(capsys, repo, page, "mtp"), ocr(capsys, repo, page, "off")
    assert mtp["tokens"] == plain["tokens"] and mtp["stats"]["proposed"] > 0
    # in the dtype the runtime chose (bfloat16 for these bfloat16 weights on a CPU that computes it natively)
    dtype = plain["model"].get("dtype") or "float32"
    model = GlmOcrForConditionalGeneration.from_pretrained(repo, dtype=getattr(torch, dtype)).eval()
    with torch.no_grad():
        reference = hf_greedy(model, reference_prompt(repo, Image.open(page).convert("RGB")), 16)
    assert plain["tokens"] == reference[:len(plain["tokens"])]


def test_gemma4_layout_is_the_published_one(published):
    target, assistant = published["gemma4"], published["assistant"]
    assert {p.name for p in target.iterdir()} == GEMMA4_IT_FILES
    config = json.loads((target / "config.json").read_text())
    assert config["model_type"] == "gemma4" and "vocab_size" not in config
    assert config["text_config"]["model_type"] == "gemma4_text"
    assert config["vision_config"]["model_type"] == "gemma4_vision"
    assert config["audio_config"]["model_type"] == "gemma4_audio"
    index = json.loads((target / "model.safetensors.index.json").read_text())
    towers = {name.split(".")[1] for name in index["weight_map"]}
    assert towers == {"language_model", "vision_tower", "embed_vision", "audio_tower", "embed_audio"}
    assert json.loads((assistant / "config.json").read_text())["model_type"] == "gemma4_assistant"
    assert not (assistant / "tokenizer.json").exists()  # the drafter shares the target's


def test_gemma4_published_chat_with_mtp_and_its_assistant(published, capsys):
    """`chat --spec mtp` on the published Gemma 4 target and its assistant: the drafter runs
    (drafts are proposed) and the output is plain decoding's, token for token."""
    target, assistant = published["gemma4"], published["assistant"]
    mtp = chat(capsys, target, assistant, "mtp")
    plain = chat(capsys, target, None, "off")
    assert mtp["tokens"] == plain["tokens"] and len(plain["tokens"]) > 0
    assert mtp["stats"]["proposed"] > 0
    assert all(r.get("note") is None for r in mtp["rounds"])  # speculation never switched off



# -- served by the loopback hub, fetched with `specscope models get`, run by id ----------------

from tests.hub.fixtures import hub, hub_env  # noqa: E402,F401  (pytest fixtures)

GEMMA4_IT, GEMMA4_ASSISTANT = "google/gemma-4-E2B-it", "google/gemma-4-E2B-it-assistant"


def add_gemma4_pair() -> None:
    """The user's catalog entries for Google's repos, the target paired with its assistant (so
    `--spec mtp` finds the drafter by itself, as for the built-in Gemma 4 entries)."""
    from dataclasses import replace

    from app.models import catalog

    catalog.add_user_entry(replace(catalog.entry_for_repo(GEMMA4_IT), gated=True, pairs_with=GEMMA4_ASSISTANT))
    catalog.add_user_entry(replace(catalog.entry_for_repo(GEMMA4_ASSISTANT, role="drafter"), gated=True,
                                   pairs_with=GEMMA4_IT))


def models_get(capsys, model_id: str) -> Path:
    from app.cli.main import main

    rc = main(["models", "get", model_id])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return Path(out.out.strip())


def test_published_repos_downloaded_run_as_from_a_local_path(published, hub, hub_env, capsys, monkeypatch):
    """zai-org/GLM-OCR and the gated Gemma 4 pair served by the loopback hub: after `models get`,
    `ocr --model glm-ocr --spec mtp` and `chat --model google/gemma-4-E2B-it --spec mtp` (the
    assistant found from the pairing) give what the same runs give from the local folders."""
    from app.models import catalog

    hub.serve_repo("zai-org/GLM-OCR", published["glm_ocr"], revision=catalog.find("glm-ocr").revision)  # its pin
    hub.serve_repo(GEMMA4_IT, published["gemma4"], gated=True)
    hub.serve_repo(GEMMA4_ASSISTANT, published["assistant"], gated=True)
    monkeypatch.setenv("HF_TOKEN", hub_env.token)  # as after accepting the licence and logging in
    add_gemma4_pair()
    snapshots = {i: models_get(capsys, i) for i in ("glm-ocr", GEMMA4_IT, GEMMA4_ASSISTANT)}
    assert all(hub_env.models_dir in p.parents or hub_env.hf_home in p.parents for p in snapshots.values())

    downloaded = ocr(capsys, "glm-ocr", published["page"], "mtp")
    local = ocr(capsys, published["glm_ocr"], published["page"], "mtp")
    assert downloaded["tokens"] == local["tokens"] and downloaded["text"] == local["text"]
    assert downloaded["stats"]["proposed"] > 0

    downloaded = chat(capsys, GEMMA4_IT, None, "mtp")  # no --draft-model: the pair's assistant
    local = chat(capsys, published["gemma4"], published["assistant"], "mtp")
    assert downloaded["tokens"] == local["tokens"] and downloaded["text"] == local["text"]
    assert downloaded["stats"]["proposed"] > 0
    assert downloaded["request"]["spec"]["draft_model"] == str(snapshots[GEMMA4_ASSISTANT])
