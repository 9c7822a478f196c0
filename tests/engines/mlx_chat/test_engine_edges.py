"""Verification edge cases (all accepted + bonus, first rejected, EOS / max_tokens / stop string
inside a burst), graceful degradation, cancellation, and loading errors."""

import json
import shutil
from pathlib import Path

import pytest

from engines.types import EngineError, Request, SpecConfig
from engines.speculative.ngram import NGramProposer
from tests.engines.mlx_chat import checkpoints
from tests.engines.chat import load_chat

PROMPT = "the cat is big and the dog is small . the cat is big and the dog is small ."


def tokens_of(rounds):
    return [t for r in rounds for t in r.tokens]


def run(engine, spec=None, max_tokens=40, **kw):
    req = Request(prompt=PROMPT, max_tokens=max_tokens, spec=spec or SpecConfig(), **kw)
    return list(engine.generate(req))


@pytest.fixture(scope="module")
def self_draft(llama_dir):
    """The target as its own draft model: every draft is accepted."""
    return load_chat(llama_dir, draft_model=llama_dir)


def test_all_accepted_plus_bonus(self_draft):
    rounds = run(self_draft, SpecConfig(method="draft", steps=5), max_tokens=38)
    decode = [r for r in rounds if not r.prefill]
    for r in decode[:-1]:
        assert r.accepted == r.proposed == 5
        assert len(r.tokens) == 6 and r.from_draft == [True] * 5 + [False]  # + the bonus token
    assert tokens_of(rounds) == tokens_of(run(self_draft, max_tokens=38))


def test_first_draft_rejected(engines):
    rounds = run(engines["llama"], SpecConfig(method="ngram", steps=4), max_tokens=48)
    rejected = [r for r in rounds if r.proposed and r.accepted == 0]
    assert rejected
    for r in rejected:
        assert len(r.tokens) == 1 and r.from_draft == [False] and r.accept_flags == [False] * r.proposed


def test_max_tokens_inside_a_burst(self_draft):
    rounds = run(self_draft, SpecConfig(method="draft", steps=7), max_tokens=12)
    assert len(tokens_of(rounds)) == 12 and rounds[-1].finish == "length"
    assert tokens_of(rounds) == tokens_of(run(self_draft, max_tokens=12))
    # 1 (prefill) + 8 + 3: the schedule never drafts past max_tokens
    assert [len(r.tokens) for r in rounds] == [1, 8, 3]


def test_eos_inside_a_burst(tmp_path, llama_dir):
    """Make a token the model emits mid-burst the EOS (in generation_config.json, as a real
    checkpoint declares it): generation stops right after it, inside the burst."""
    plain = tokens_of(run(load_chat(llama_dir), max_tokens=30))
    i = next(i for i in range(11, 30) if plain[i] not in plain[:i])
    d = tmp_path / "eos"
    shutil.copytree(llama_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["eos_token_id"] = plain[i]
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": plain[i]}))
    engine = load_chat(str(d), draft_model=str(d))
    rounds = run(engine, SpecConfig(method="draft", steps=7), max_tokens=30)
    assert tokens_of(rounds) == plain[: i + 1]
    assert rounds[-1].finish == "stop" and rounds[-1].tokens[-1] == plain[i]
    assert len(rounds[-1].tokens) < rounds[-1].proposed + 1  # cut inside the burst
    assert tokens_of(run(engine, max_tokens=30)) == plain[: i + 1]  # plain agrees


def test_stop_string_inside_a_burst(self_draft):
    full = run(self_draft, max_tokens=30)
    text = "".join(r.text for r in full)
    words = text.split()
    stop = " ".join(words[12:14])
    req = Request(prompt=PROMPT, max_tokens=30, stop=[stop], spec=SpecConfig(method="draft", steps=7))
    rounds = list(self_draft.generate(req))
    out = "".join(r.text for r in rounds)
    assert rounds[-1].finish == "stop"
    assert stop not in out and text.startswith(out) and len(out) == text.index(stop)


def test_a_run_ending_inside_an_accepted_burst_counts_the_verdict(self_draft):
    """Round.accepted is the verifier's verdict, before clipping (engines/speculative/rounds.py):
    a run cut at a stop string inside a fully accepted burst keeps acceptance at 100%, while
    from_draft and tokens say what was emitted."""
    from engines.speculative.rounds import session_stats

    text = "".join(r.text for r in run(self_draft, max_tokens=30))
    stop = " " + " ".join(text.split()[4:6])  # inside the first burst of 7 drafts + 1
    req = Request(prompt=PROMPT, max_tokens=30, stop=[stop], spec=SpecConfig(method="draft", steps=7))
    rounds = list(self_draft.generate(req))
    last = rounds[-1]
    assert last.finish == "stop" and last.accepted == last.proposed == 7
    assert sum(last.from_draft) == len(last.tokens) < last.accepted  # clipped inside the drafts
    assert last.accept_flags == [True] * 7
    assert session_stats(rounds).acceptance_rate == 1.0


class FailingProposer(NGramProposer):
    """A real n-gram drafter that breaks on its third proposal (a drafter failing mid-run)."""

    calls = 0

    def propose(self, ctx, k):
        self.calls += 1
        if self.calls == 3:
            raise ValueError("drafter broke")
        return super().propose(ctx, k)


def test_graceful_degradation(llama_dir, engines, monkeypatch):
    engine = load_chat(llama_dir)
    monkeypatch.setattr("engines.batch.engine.NGramProposer", FailingProposer)  # the batch's n-gram rows
    rounds = run(engine, SpecConfig(method="ngram", steps=3), max_tokens=40)
    notes = [r for r in rounds if r.note]
    assert len(notes) == 1 and "speculation stopped" in notes[0].note and "drafter broke" in notes[0].note
    after = rounds[rounds.index(notes[0]) + 1:]
    assert after and all(r.proposed == 0 for r in after)
    assert tokens_of(rounds) == tokens_of(run(engines["llama"], max_tokens=40))


def test_cancel_between_rounds(engines):
    """Stop asked after the second Round was read: the next Round is the last, "cancelled"."""
    rounds = []
    for rnd in engines["llama"].generate(Request(prompt=PROMPT, max_tokens=40), lambda: len(rounds) >= 2):
        rounds.append(rnd)
    assert len(rounds) == 3 and rounds[-1].finish == "cancelled"
    assert all(r.finish is None for r in rounds[:-1])


def test_model_info(engines, llama_dir):
    info = engines["llama"].model_info()
    assert info["path"] == llama_dir and info["model_type"] == "llama"
    assert info["vocab_size"] == 79 and len(info["hash"]) == 16


# -- loading errors: one clear line each ---------------------------------------------------------


def broken(tmp_path, llama_dir, name, edit):
    d = tmp_path / name
    shutil.copytree(llama_dir, d)
    edit(d)
    return str(d)


@pytest.mark.parametrize(
    "name, edit, message",
    [
        ("no_config", lambda d: (d / "config.json").unlink(), "has no config.json"),
        ("bad_json", lambda d: (d / "config.json").write_text("{oops"), "corrupt config.json"),
        ("no_weights", lambda d: (d / "model.safetensors").unlink(), "no model*.safetensors"),
        ("unknown_arch", lambda d: (d / "config.json").write_text(json.dumps({"model_type": "nonesuch"})),
         "unsupported architecture 'nonesuch'"),
        ("bad_weights", lambda d: (d / "model.safetensors").write_bytes(b"\x10\x00" * 64), "corrupt or mismatched weights"),
    ],
)
def test_loading_errors(tmp_path, llama_dir, name, edit, message):
    with pytest.raises(EngineError) as e:
        load_chat(broken(tmp_path, llama_dir, name, edit))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_missing_path():
    with pytest.raises(EngineError, match="model not found"):
        load_chat("/nonexistent/model")


def test_draft_with_another_tokenizer_is_refused(tmp_path, llama_dir):
    words = list(checkpoints.WORDS)
    words[0], words[1] = words[1], words[0]  # same size, two ids swapped
    other = checkpoints.make_tiny_llama(tmp_path / "other", words=words)
    with pytest.raises(EngineError, match="does not share the target's tokenizer: 2 tokens map"):
        load_chat(llama_dir, draft_model=str(other))
