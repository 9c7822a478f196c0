"""The OpenAI chat-completions wire format for `specscope serve`: a request body becomes an
engines.Request, Rounds become chunks and responses, problems become OpenAI-style error bodies.
Pure functions over dicts; no HTTP here."""

from __future__ import annotations

import base64
import binascii
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace

from engines.types import Request, Sampling, SpecConfig
from engines.speculative.repetition import DEFAULT_MAX_REPEAT
from engines.speculative.rounds import Round
from engines.speculative.schedule import PRESETS
from engines.validation import SEED_LIMIT, InvalidParameter, validate

OCR_TASKS = ("text", "table", "formula")
# What an OCR model answers to a message without an image (the glmocr SDK's start-up check
# sends "hello" and waits for a 200), without running the model.
OCR_TEXT_ONLY_REPLY = ("This model reads images: send the page as an image_url content part (a base64 data: URL) "
                       "and, optionally, its task as text: text, table or formula, or GLM-OCR's own prompts "
                       "\"Text Recognition:\", \"Table Recognition:\", \"Formula Recognition:\".")
DEFAULT_MAX_TOKENS = 256
MAX_CHOICES = 8  # OpenAI's n: choices per request
# Request fields as this API spells them (the rest keep their names: temperature, top_p, ...).
SPEC_PARAMS = {"spec": "speculative.method", "steps": "speculative.steps", "max_steps": "speculative.preset"}


class ApiError(Exception):
    """A request the server refuses; becomes {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class ParsedRequest:
    model: str
    stream: bool
    request: Request
    image_file: str | None = None  # a temporary file holding the image of an OCR request
    include_usage: bool = False
    n: int = 1  # choices: n sequences of the same prompt (in a batch they share its prefill)
    reply: str | None = None  # answered as it is, without running the model (text sent to an OCR model)

    def choice(self, index: int) -> Request:
        """Choice `index`'s request: the same, with its own seed (seed + index) when one is given."""
        s = self.request.sampling
        if index == 0 or s.seed is None:
            return self.request
        return replace(self.request, sampling=replace(s, seed=(s.seed + index) % SEED_LIMIT))


@dataclass
class ServedModel:
    """One model the server answers for: its id, the engine kind, and the speculation and
    repetition stop it uses when a request does not say."""

    id: str
    kind: str  # "chat" | "ocr"
    spec: SpecConfig = field(default_factory=SpecConfig)
    max_repeat: int = DEFAULT_MAX_REPEAT  # serve --max-repeat; a request's "max_repeat" overrides it


def parse_chat_request(body, models: dict[str, ServedModel], context_length=lambda model_id: None) -> ParsedRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_body")
    model_id = body.get("model")
    if not isinstance(model_id, str) or not model_id:
        raise ApiError(400, "'model' is required", "missing_model", "model")
    served = models.get(model_id)
    if served is None:
        raise ApiError(404, f"the model {model_id!r} does not exist; this server serves: {', '.join(models)}",
                       "model_not_found", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise ApiError(400, "'messages' must be a non-empty list of message objects", "invalid_messages", "messages")
    request = Request(kind=served.kind, spec=speculative(body.get("speculative"), served.spec),
                      sampling=sampling(body), max_tokens=max_tokens(body), stop=stops(body.get("stop")),
                      max_repeat=body.get("max_repeat", served.max_repeat))
    check_parameters(request, context_length(model_id))
    image_file = reply = None
    if served.kind == "ocr" and not has_image(messages[-1]):
        reply = OCR_TEXT_ONLY_REPLY
    elif served.kind == "ocr":
        image_file = ocr_input(messages, request)
    else:
        chat_input(messages, request)
    options = body.get("stream_options") or {}
    return ParsedRequest(model=model_id, stream=bool(body.get("stream", False)), request=request,
                         image_file=image_file, include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
                         n=choices(body.get("n", 1)), reply=reply)


def choices(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_CHOICES:
        raise ApiError(400, f"n must be an integer in 1..{MAX_CHOICES}", "invalid_value", "n")
    return value


def chat_input(messages: list[dict], request: Request) -> None:
    turns = [{"role": m.get("role"), "content": text_of(m.get("content"))} for m in messages]
    if turns[-1]["role"] != "user":
        raise ApiError(400, "the last message must be the user's", "invalid_messages", "messages")
    if turns[0]["role"] == "system":
        request.system = turns.pop(0)["content"]
    request.prompt = turns[-1]["content"]
    request.history = turns[:-1]
    if not request.prompt.strip():
        raise ApiError(400, "the last user message is empty", "invalid_messages", "messages")


def text_of(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) == len(content):
            return "".join(parts)
        raise ApiError(400, "this model reads text only; send images to the OCR model", "unsupported_content", "messages")
    raise ApiError(400, "a message's 'content' must be a string or a list of parts", "invalid_messages", "messages")


def has_image(message: dict) -> bool:
    parts = message.get("content")
    return isinstance(parts, list) and any(isinstance(p, dict) and p.get("type") == "image_url" for p in parts)


def ocr_task(text: str) -> str | None:
    """A text part's task: the bare word (text | table | formula) or GLM-OCR's own prompt for it
    ("Table Recognition:", as the glmocr SDK sends it); None for any other text."""
    from engines.glm_ocr.prompts import TASK_PROMPTS

    word = text.strip().lower()
    if word in OCR_TASKS:
        return word
    return next((task for task, prompt in TASK_PROMPTS.items() if word.rstrip(":").strip() == prompt.lower().rstrip(":")),
                None)


def ocr_input(messages: list[dict], request: Request) -> str:
    """GLM-OCR: the user's image_url part (a data: URL) is the page; a text part may name the
    task (text | table | formula, or GLM-OCR's prompt for it)."""
    parts = messages[-1].get("content")
    parts = parts if isinstance(parts, list) else []
    images = [p for p in parts if isinstance(p, dict) and p.get("type") == "image_url"]
    if len(images) != 1:
        raise ApiError(400, "an OCR request needs exactly one image_url content part", "invalid_messages", "messages")
    texts = [p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text"]
    task = next((t for t in map(ocr_task, texts) if t is not None), "text")
    request.task = task
    url = (images[0].get("image_url") or {}).get("url", "")
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        raise ApiError(400, "the image must be a base64 data: URL (the server fetches nothing)", "invalid_image", "messages")
    try:
        data = base64.b64decode(url.split(";base64,", 1)[1], validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "the image's base64 data is malformed", "invalid_image", "messages") from None
    with tempfile.NamedTemporaryFile(prefix="specscope-serve-", suffix=".img", delete=False) as f:
        f.write(data)
    request.image = f.name
    return f.name


def speculative(value, default: SpecConfig) -> SpecConfig:
    """The per-request `speculative` object: {method, steps, preset, adaptive}; absent keys keep
    the server's launch settings. Ranges are engines.validation's to check."""
    if value is None:
        return replace(default)
    if not isinstance(value, dict):
        raise ApiError(400, "'speculative' must be an object", "invalid_speculative", "speculative")
    unknown = set(value) - {"method", "steps", "preset", "adaptive"}
    if unknown:
        raise ApiError(400, f"unknown 'speculative' keys: {', '.join(sorted(unknown))}", "invalid_speculative", "speculative")
    spec = replace(default, method=value.get("method", default.method))
    preset = value.get("preset")
    if preset is not None:
        if preset not in PRESETS:
            raise ApiError(400, f"speculative.preset must be one of {', '.join(sorted(PRESETS))}", "invalid_speculative",
                           "speculative.preset")
        spec.steps, spec.max_steps = PRESETS[preset].steps, PRESETS[preset].max_steps
    spec.steps = value.get("steps", spec.steps)
    spec.adaptive = bool(value.get("adaptive", spec.adaptive))
    if spec.steps == 0:
        spec.method = "off"
    return spec


def sampling(body: dict) -> Sampling:
    return Sampling(temperature=body.get("temperature") if body.get("temperature") is not None else 0.0,
                    top_p=body.get("top_p") if body.get("top_p") is not None else 1.0,
                    top_k=body.get("top_k") or 0, seed=body.get("seed"))


def max_tokens(body: dict) -> int:
    return body.get("max_completion_tokens", body.get("max_tokens", DEFAULT_MAX_TOKENS))


def stops(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or len(value) > 4:
        raise ApiError(400, "'stop' must be a string or a list of up to 4 strings", "invalid_value", "stop")
    return value


def check_parameters(request: Request, context_length: int | None) -> None:
    """The shared check (engines.validation): one ApiError naming the parameter."""
    try:
        validate(request, context_length)
    except InvalidParameter as e:
        name = SPEC_PARAMS.get(e.name, e.name)
        code = "invalid_speculative" if name.startswith("speculative") else "invalid_value"
        raise ApiError(400, f"{name} {e.problem}", code, name) from None


# -- responses ----------------------------------------------------------------------------------
def finish_reason(rnd: Round | None) -> str:
    # The OpenAI schema knows stop | length; a cancelled run has no client left to read it.
    return "length" if rnd is not None and rnd.finish == "length" else "stop"


def round_record(rnd: Round, decode) -> dict:
    """The engine's Round as sent in a chunk, with each token's own text so a client can show
    which characters came from accepted drafts."""
    return rnd.to_dict() | {"token_texts": [decode([t]) for t in rnd.tokens]}


def timings(rounds: list[Round], prompt_n: int | None) -> dict:
    """llama.cpp's `timings` names, computed from the rounds."""
    prefill = [r for r in rounds if r.prefill]
    decode = [r for r in rounds if not r.prefill]
    predicted_n = sum(len(r.tokens) for r in rounds)
    prompt_ms = 1000 * sum(r.wall_s for r in prefill)
    predicted_ms = 1000 * sum(r.wall_s for r in decode)
    decode_tokens = sum(len(r.tokens) for r in decode)
    return {
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        # decode tokens over decode time, prefill excluded (the first token is the prefill's)
        "predicted_per_second": 1000 * decode_tokens / predicted_ms if predicted_ms > 0 else None,
        "draft_n": sum(r.proposed for r in rounds),
        "draft_n_accepted": sum(r.accepted for r in rounds),
    }


def usage(prompt_n: int | None, rounds: list[Round]) -> dict:
    completion = sum(len(r.tokens) for r in rounds)
    return {"prompt_tokens": prompt_n or 0, "completion_tokens": completion, "total_tokens": (prompt_n or 0) + completion}


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def chunk(cid: str, model: str, created: int, delta: dict, finish: str | None = None, index: int = 0, **extra) -> dict:
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish}], **extra}


def completion(cid: str, model: str, choices: list[list[Round]], prompt_n: int | None, decode) -> dict:
    """One choice per list of Rounds. `timings` and `usage` count every choice (the prompt
    once); `rounds` are the first choice's, and with n > 1 each choice carries its own rounds
    and timings too."""
    def one(index: int, rounds: list[Round]) -> dict:
        c = {"index": index, "message": {"role": "assistant", "content": "".join(r.text for r in rounds)},
             "finish_reason": finish_reason(rounds[-1] if rounds else None)}
        if len(choices) > 1:
            c |= {"timings": timings(rounds, prompt_n), "rounds": [round_record(r, decode) for r in rounds]}
        return c

    every = [r for rounds in choices for r in rounds]
    return {
        "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [one(i, rounds) for i, rounds in enumerate(choices)],
        "usage": usage(prompt_n, every),
        "timings": timings(every, prompt_n),
        "rounds": [round_record(r, decode) for r in choices[0]],
    }


def reply_completion(cid: str, model: str, text: str, n: int = 1) -> dict:
    """A fixed answer (ParsedRequest.reply) as a chat.completion: no tokens were generated."""
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                        for i in range(n)],
            "usage": usage(0, [])}


def reply_chunks(cid: str, model: str, text: str, n: int = 1) -> list[dict]:
    """The same answer as the chunks of a stream (the caller adds the [DONE] line)."""
    created = int(time.time())
    return [c for i in range(n) for c in (chunk(cid, model, created, {"role": "assistant", "content": ""}, index=i),
                                          chunk(cid, model, created, {"content": text}, index=i),
                                          chunk(cid, model, created, {}, "stop", index=i))]
