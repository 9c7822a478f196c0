"""What `specscope serve --ranks N / --hostfile FILE` refuses before any rank starts, each as one
line: a wrong hostfile, a model mlx-lm cannot split by heads (--split tensor), a model split
neither by heads nor into a pipeline, and what the ranks do not serve (GLM-OCR); and which split
auto picks. In process: no rank is launched."""

from __future__ import annotations

import json
import shutil

import pytest

from app.cli.main import main
from tests.engines.mlx_chat.gemma4.conftest import dense_pair  # noqa: F401  (the tiny Gemma 4 pair)
from tests.engines.mlx_chat import checkpoints

pytest.importorskip("mlx.core")


def refused(capsys, *argv) -> str:
    assert main(["serve", *argv]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("content, says", [
    (None, "no such file"),
    ("{not json", "not JSON"),
    ('{"hosts": []}', "expected a list of hosts"),
    ('[{"ssh": "mac-1"}]', 'needs "ssh" (a name) and "ips"'),
    ('[{"ssh": "mac-1", "ips": ["mac-1.local"]}]', "is not an IP address"),
])
def test_a_wrong_hostfile_is_one_line(tmp_path, llama, capsys, content, says):
    hostfile = tmp_path / "hosts.json"
    if content is not None:
        hostfile.write_text(content)
    line = refused(capsys, "--model", llama, "--hostfile", str(hostfile))
    assert line.startswith(f"specscope: error: --hostfile {hostfile}") and says in line, line


def test_a_model_mlx_lm_cannot_split_by_heads_is_one_line_naming_what_can(tmp_path, capsys):
    gemma3 = str(checkpoints.make_tiny_gemma3(tmp_path / "gemma3"))
    capsys.readouterr()  # the checkpoint writer's progress bar
    line = refused(capsys, "--model", gemma3, "--ranks", "2", "--split", "tensor")
    assert "cannot split a 'gemma3_text' model over ranks by heads" in line and "llama" in line, line


def test_what_tensor_parallel_cannot_split_goes_into_a_pipeline(tmp_path, llama, dense_pair):
    """auto: Gemma 3 and 4 have no shard(); an MTP drafter reads a whole layer's K/V; SmolLM2's
    9 / 3 heads do not divide by 2 (a llama with 2 layers over 3 ranks: one layer per rank)."""
    from engines.distributed.engine import PIPELINE, TENSOR, choose_split

    gemma3 = str(checkpoints.make_tiny_gemma3(tmp_path / "gemma3"))
    assert choose_split(gemma3, 2) == PIPELINE
    assert choose_split(str(dense_pair.target), 2, mtp=True) == PIPELINE
    assert choose_split(llama, 2) == TENSOR
    assert choose_split(llama, 2, mtp=True) == PIPELINE
    assert choose_split(llama, 2, "pipeline") == PIPELINE


def test_ocr_is_not_split(llama, capsys):
    line = refused(capsys, "--model", llama, "--ranks", "2", "--ocr-model", "glm-ocr")
    assert "split the chat model only" in line, line


def test_the_hostfile_format_is_mlx_launchs(tmp_path):
    from engines.distributed.launch import check_hostfile

    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps({"backend": "ring", "hosts": [{"ssh": "mac-1.local", "ips": ["10.0.0.1"]},
                                                                  {"ssh": "mac-2.local", "ips": ["10.0.0.2"]}]}))
    assert check_hostfile(str(hostfile)) == 2


def test_heads_that_do_not_divide_and_too_few_layers_for_a_pipeline_are_one_line(llama, capsys):
    line = refused(capsys, "--model", llama, "--ranks", "3")  # 4 query / 2 KV heads, 2 layers
    assert "4 query / 2 KV heads (not divisible by 3)" in line and "a layer per rank" in line, line


@pytest.mark.skipif(not shutil.which("ssh"), reason="needs an ssh client")
def test_a_host_that_cannot_be_reached_is_one_line(tmp_path, llama, capsys):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]},
                                    {"ssh": "mac-2.invalid", "ips": ["10.0.0.2"]}]))
    line = refused(capsys, "--model", llama, "--hostfile", str(hostfile))
    assert "cannot reach mac-2.invalid over ssh" in line, line
