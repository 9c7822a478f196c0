"""`specscope serve` reading a page: GLM-OCR (tiny random checkpoint in the real layout, torch
runtime) behind /v1/chat/completions, the image sent as an image_url content part, answered
with the same tokens and rounds as the local engine -- through serve's batch (OcrBatch), alone
or many requests at once."""

from __future__ import annotations

import base64
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("torch")

from app.serve.protocol import ServedModel  # noqa: E402
from app.serve.server import ServeConfig, Served, build_app, start_in_thread  # noqa: E402
from engines.types import Request, SpecConfig  # noqa: E402
from tests.engines.glm_ocr import checkpoints  # noqa: E402

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def ocr(tmp_path_factory):
    from engines.glm_ocr.engine import OcrEngine

    root = tmp_path_factory.mktemp("serve_ocr")
    engine = OcrEngine.load(checkpoints.make_tiny_glm_ocr(root / "tiny"), runtime="torch", cache_length=320)
    engine.repetition = None  # a random tiny model loops; that guard has its own tests
    image = root / "page.png"
    checkpoints.test_images(1)[0].save(image)  # (imported as a module: pytest would collect test_images)
    running = start_in_thread(build_app(ServeConfig(), [
        Served(ServedModel("glm-ocr", "ocr", SpecConfig(method="mtp", steps=2)), engine)]))
    yield engine, image, running
    running.stop()


def test_an_image_content_part_is_read_like_the_local_engine_reads_it(ocr):
    engine, image, running = ocr
    local = list(engine.generate(Request(kind="ocr", image=str(image), task="table", max_tokens=MAX_TOKENS,
                                         spec=SpecConfig(method="mtp", steps=2))))
    client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    resp = client.chat.completions.create(model="glm-ocr", max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "table"}]}])
    rounds = resp.model_extra["rounds"]
    assert [r["tokens"] for r in rounds] == [r.tokens for r in local]
    assert resp.choices[0].message.content == "".join(r.text for r in local)
    assert resp.model_extra["timings"]["draft_n"] == sum(r.proposed for r in local) > 0


def test_text_without_an_image_gets_a_short_answer_not_an_error(ocr):
    """The glmocr SDK's start-up check sends "hello" to the OCR model and waits for a 200."""
    _, _, running = ocr
    client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
    for content in ("read this", [{"type": "text", "text": "hello"}]):
        resp = client.chat.completions.create(model="glm-ocr", max_tokens=10, temperature=0.1,
                                              messages=[{"role": "user", "content": content}])
        assert resp.choices[0].finish_reason == "stop" and resp.usage.completion_tokens == 0
        assert "image_url" in resp.choices[0].message.content
    stream = client.chat.completions.create(model="glm-ocr", stream=True, messages=[{"role": "user", "content": "hello"}])
    assert "image_url" in "".join(c.choices[0].delta.content or "" for c in stream)


@pytest.mark.parametrize("prompt, task", [("Table Recognition:", "table"), ("Formula Recognition:", "formula"),
                                          ("formula", "formula"), ("Text Recognition:", "text")])
def test_glm_ocrs_own_task_prompts_select_the_task(ocr, prompt, task):
    """As the SDK sends a region: the image, then its task's prompt."""
    engine, image, running = ocr
    local = list(engine.generate(Request(kind="ocr", image=str(image), task=task, max_tokens=MAX_TOKENS,
                                         spec=SpecConfig(method="mtp", steps=2))))
    client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    resp = client.chat.completions.create(model="glm-ocr", max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": prompt}]}])
    assert [r["tokens"] for r in resp.model_extra["rounds"]] == [r.tokens for r in local]
    if task != "text":  # the task is seen: its prompt reads otherwise than the text prompt
        as_text = list(engine.generate(Request(kind="ocr", image=str(image), task="text", max_tokens=MAX_TOKENS)))
        assert [t for r in as_text for t in r.tokens] != [t for r in local for t in r.tokens]


def test_an_ocr_request_with_two_images_is_refused(ocr):
    _, image, running = ocr
    client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="glm-ocr", messages=[{"role": "user", "content": [part, part]}])
    assert "exactly one image_url" in err.value.body["message"]


def test_concurrent_pages_are_read_in_one_batch_each_as_alone(ocr):
    """Four requests at once (different tasks and speculation): they share target forwards
    (/metrics' batch size reaches more than one row), and each gets its lone run's tokens."""
    engine, image, running = ocr
    asks = [("text", 2), ("table", 2), ("formula", 0), ("text", 4)]
    local = [[t for r in engine.generate(Request(kind="ocr", image=str(image), task=task, max_tokens=MAX_TOKENS,
                                                 spec=SpecConfig(method="mtp", steps=k) if k else SpecConfig()))
              for t in r.tokens] for task, k in asks]
    client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()

    def read(ask):
        task, k = ask
        resp = client.chat.completions.create(
            model="glm-ocr", max_tokens=MAX_TOKENS, extra_body={"speculative": {"steps": k}},
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                   {"type": "text", "text": task}]}])
        return [t for r in resp.model_extra["rounds"] for t in r["tokens"]]

    def multi_row_steps() -> float:
        text = urllib.request.urlopen(f"{running.url}/metrics").read().decode()
        count = next(float(l.split()[1]) for l in text.splitlines() if l.startswith("specscope:batch_size_count"))
        one = next(float(l.split()[1]) for l in text.splitlines() if l.startswith('specscope:batch_size_bucket{le="1.0"}'))
        return count - one

    before = multi_row_steps()
    with ThreadPoolExecutor(len(asks)) as pool:
        got = list(pool.map(read, asks))
    assert got == local
    assert multi_row_steps() > before


def test_an_ocr_batch_that_cannot_fit_in_memory_is_refused_at_start_in_one_line(ocr):
    """A row's K/V per token is counted from the config (every decoder layer and the row's own
    MTP cache, in the compute dtype) -- equal to what a row of the batch really holds per token --
    and a batch whose rows at full context cannot sit beside the weights is refused at start."""
    from engines.glm_ocr.batch import OcrBatch
    from engines.types import EngineError

    engine, image, _ = ocr
    batch = OcrBatch(engine, max_batch=2)
    seq = batch.submit(Request(kind="ocr", image=str(image), max_tokens=4, spec=SpecConfig(method="mtp", steps=2)))
    batch.step()
    batch.step()  # the row in the batch, its MTP cache written
    kv = batch.target.kv
    held = sum(kv.keys[i][0, :, :1].nbytes + kv.values[i][0, :, :1].nbytes for i in kv.keys)
    mtp = seq.proposer.cache  # the row's own MTP cache (runtime_fast.KVCache): one layer
    held += sum(t[0, :, :1].nbytes for kind in (mtp.keys, mtp.values) for t in kind.values())
    assert engine.runtime.kv_bytes_per_token() == held
    batch.clear()

    served = [Served(ServedModel("glm-ocr", "ocr", SpecConfig(method="mtp", steps=2)), engine)]
    weights = engine.runtime.weights_bytes()
    room = weights + 8 * engine.runtime.cache_length * held  # 8 rows at full context and the weights
    with pytest.raises(EngineError) as refused:
        build_app(ServeConfig(max_batch=8, memory_bytes=int(room / 0.75) - 1), served)
    assert "--max-batch 8" in str(refused.value) and "\n" not in str(refused.value)
    build_app(ServeConfig(max_batch=8, memory_bytes=int(room / 0.75) + 1), served)  # it fits


def test_usage_counts_the_pages_prompt_tokens_image_tokens_included(ocr):
    """usage.prompt_tokens of a read page is the engine's count of the prompt it built: the
    prompt text and one token per merged image patch, the same ids the page was read from."""
    engine, image, running = ocr
    request = Request(kind="ocr", image=str(image), task="table", max_tokens=MAX_TOKENS)
    _, prompt = engine.sequence(request)
    image_tokens = prompt.ids.count(engine.config.image_token_id)
    client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    resp = client.chat.completions.create(model="glm-ocr", max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "table"}]}])
    assert resp.usage.prompt_tokens == engine.count_prompt_tokens(request) == len(prompt.ids) > image_tokens > 0
    assert resp.model_extra["timings"]["prompt_n"] == resp.usage.prompt_tokens
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
