"""The HTTP application (Starlette) and its server (uvicorn).

``POST /translate`` takes ``{"text": "a sentence" | ["a sentence", ...], "beam": 4, "n_best": 1,
"alignment": false}`` (only ``text`` required) and answers ``{"translations": [...]}`` in request
order: per sentence ``{"text", "score", "tokens", "source_tokens"}`` (+ ``"alignment"`` when
asked: one row per target token over the source tokens), or with ``n_best`` > 1
``{"hypotheses": [...]}`` of that shape. ``GET /health`` and ``GET /info`` describe the server,
``GET /`` is a page to try the model. ``score`` is the natural log, as fairseq's generator and
CTranslate2 give it (fairseq-generate prints it divided by ln 2, in base 2, as the page shows it).
A bad request is answered 4xx with
``{"error": "<one line>"}``, and the server goes on serving.
"""
import contextlib
import json
import logging
from dataclasses import asdict, dataclass
from importlib import resources
from typing import List, Tuple

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from fairseq_plugins.serve.backends import Options
from fairseq_plugins.serve.batching import Batcher

logger = logging.getLogger(__name__)

OPTIONS = ("text", "beam", "n_best", "alignment")


@dataclass(frozen=True)
class Limits:
    """What one request may hold; above it the request is refused with 400 (413 for the body)."""
    max_chars: int = 2000  # characters per sentence
    max_source_tokens: int = 250  # per sentence, after tokenization and BPE
    max_sentences: int = 64  # per request
    max_beam: int = 64
    max_body_bytes: int = 1 << 20


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _integer(body: dict, name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer, got {json.dumps(value)[:40]}")
    if not low <= value <= high:
        raise BadRequest(f"{name} {value} is out of range [{low}, {high}]")
    return value


def parse_request(raw: bytes, limits: Limits) -> Tuple[List[str], Options]:
    """The sentences and options of a ``POST /translate`` body, or :class:`BadRequest`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"request body is not UTF-8: byte 0x{raw[e.start]:02x} at position {e.start}") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRequest(f"malformed JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest('the body must be a JSON object, e.g. {"text": "a sentence"}')
    unknown = sorted(set(body) - set(OPTIONS))
    if unknown:
        raise BadRequest(f"unknown option(s) {', '.join(map(repr, unknown))}; known: {', '.join(OPTIONS)}")
    if "text" not in body:
        raise BadRequest('"text" is required: a sentence or a list of sentences')
    sentences = [body["text"]] if isinstance(body["text"], str) else body["text"]
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise BadRequest('"text" must be a string or a list of strings')
    if not 1 <= len(sentences) <= limits.max_sentences:
        raise BadRequest(f'"text" holds {len(sentences)} sentences; give 1 to {limits.max_sentences} (--max-sentences)')
    for k, sentence in enumerate(sentences):
        if not sentence.strip():
            raise BadRequest(f"text[{k}] is empty")
        if len(sentence) > limits.max_chars:
            raise BadRequest(f"text[{k}] has {len(sentence)} characters, above the limit of {limits.max_chars} "
                             "(--max-chars)")
        try:
            sentence.encode("utf-8")
        except UnicodeEncodeError as e:
            raise BadRequest(f"text[{k}] holds a lone surrogate \\u{ord(sentence[e.start]):04x}") from None
    beam = _integer(body, "beam", Options.beam, 1, limits.max_beam)
    n_best = _integer(body, "n_best", Options.n_best, 1, beam)
    alignment = body.get("alignment", Options.alignment)
    if not isinstance(alignment, bool):
        raise BadRequest(f"alignment must be true or false, got {json.dumps(alignment)[:40]}")
    return sentences, Options(beam, n_best, alignment)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it passes ``limit`` bytes."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"request body above the limit of {limit} bytes", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def build_app(backend, batcher: Batcher, limits: Limits, info: dict) -> Starlette:
    page = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
    drawing = resources.files(__package__).joinpath("heatmap.js").read_text(encoding="utf-8")  # shared with the ONNX page
    text = backend.text

    def hypothesis(h, source_tokens):
        out = {"text": text.decode(h.tokens), "score": h.score, "tokens": h.tokens, "source_tokens": source_tokens}
        if h.alignment is not None:
            out["alignment"] = h.alignment
        return out

    async def translate(request: Request):
        try:
            sentences, options = parse_request(await read_body(request, limits.max_body_bytes), limits)
            if options.alignment and not backend.has_attention:
                raise BadRequest(f"alignment: a {backend.family} model has no attention to align with")
            sources = [text.encode(s) for s in sentences]
            for k, tokens in enumerate(sources):
                if not tokens:
                    raise BadRequest(f"text[{k}] is empty after tokenization")
                if len(tokens) > limits.max_source_tokens:
                    raise BadRequest(f"text[{k}] has {len(tokens)} tokens after tokenization, above the limit "
                                     f"of {limits.max_source_tokens} (--max-source-tokens)")
        except BadRequest as e:
            return _error(e.status, str(e))
        try:
            results = await batcher.translate(sources, options)
        except Exception as e:  # the backend failed on this batch: say so, keep serving
            return _error(500, f"translation failed: {type(e).__name__}: {e}".splitlines()[0])
        translations = []
        for tokens, hypos in zip(sources, results):
            if options.n_best == 1:
                translations.append(hypothesis(hypos[0], tokens))
            else:
                translations.append({"hypotheses": [hypothesis(h, tokens) for h in hypos]})
        return JSONResponse({"translations": translations})

    async def health(request: Request):
        return JSONResponse({"status": "ok", "waiting": batcher.waiting, "batching": batcher.stats.as_dict()})

    async def information(request: Request):
        return JSONResponse({**info, "limits": asdict(limits)})

    async def index(request: Request):
        return HTMLResponse(page)

    async def heatmap(request: Request):
        return Response(drawing, media_type="text/javascript")

    async def http_error(request: Request, exc: HTTPException):
        return _error(exc.status_code, exc.detail)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await batcher.start()
        yield
        await batcher.stop()
        logger.info("served %d sentences in %d batches (largest %d)", batcher.stats.sentences,
                    batcher.stats.batches, batcher.stats.largest_batch)

    routes = [Route("/", index), Route("/heatmap.js", heatmap), Route("/health", health), Route("/info", information),
              Route("/translate", translate, methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
