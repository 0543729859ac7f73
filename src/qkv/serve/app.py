"""The HTTP service: one FastAPI app over the hosted models.

Endpoints (their request and response schemas are on the OpenAPI page, ``/docs``):

- ``POST /v1/translate``, ``/v1/tag``, ``/v1/classify``: JSON lists of sentences or texts.
- ``POST /v1/classify-image``: an uploaded image (multipart form, field ``image``).
- ``POST /v1/attention`` (JSON text) and ``/v1/attention-image`` (upload): the output and every
  layer's and head's attention, in the data format of the attention explorer page.
- ``GET /v1/models``, ``GET /health``, and the live page at ``/``.
"""

from __future__ import annotations

import asyncio
import io
import math
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, File, Form, UploadFile
from fastapi.responses import HTMLResponse
from PIL import Image
from pydantic import BaseModel, Field

from qkv.serve.errors import BadRequest, BodyLimit, install
from qkv.serve.models import HostedModel
from qkv.serve.page import live_page
from qkv.serve.settings import ServeSettings
from qkv.viz.page import page_data

MODEL_FIELD = Field(None, description="a hosted model's name; may be left out when one fits")
ImageUpload = Annotated[UploadFile, File(description="the image file (PNG, JPEG, ...)")]
ModelForm = Annotated[str | None, Form(description="a hosted model's name")]


class TranslateRequest(BaseModel):
    model: str | None = MODEL_FIELD
    sentences: list[str] = Field(description="sentences to translate, one output each")
    beam: int | None = Field(None, description="beam size; 1 is greedy (default: the run's)")
    length_penalty: float | None = Field(
        None, description="exponent alpha of score/len^alpha (default: the run's)"
    )


class TagRequest(BaseModel):
    model: str | None = MODEL_FIELD
    sentences: list[str] = Field(description="sentences; words are split on whitespace")


class ClassifyRequest(BaseModel):
    model: str | None = MODEL_FIELD
    texts: list[str] = Field(description="texts to label")


class AttentionRequest(BaseModel):
    model: str | None = MODEL_FIELD
    text: str = Field(description="the one sentence or text to look inside")


class TranslateResponse(BaseModel):
    model: str
    translations: list[str]


class WordTag(BaseModel):
    word: str
    tag: str


class TagResponse(BaseModel):
    model: str
    tags: list[list[WordTag]]


class Label(BaseModel):
    label: str
    probability: float


class ClassifyResponse(BaseModel):
    model: str
    labels: list[Label]


class ImageResponse(Label):
    model: str


class Service:
    """The hosted models and the limits every request is checked against."""

    def __init__(self, models: dict[str, HostedModel], settings: ServeSettings) -> None:
        self.models, self.settings = models, settings

    def pick(self, name: str | None, command: str | None = None) -> HostedModel:
        """The model a request names (or the only one that fits); a bad name is 404."""
        fits = [m for m in self.models.values() if command in (None, m.command)]
        if name is None:
            if len(fits) == 1:
                return fits[0]
            names = ", ".join(m.name for m in fits) or "none"
            raise BadRequest(f"name the model: the models for this endpoint are {names}")
        if name not in self.models:
            raise BadRequest(
                f"no model called {name!r}; the models are {', '.join(self.models)}", 404
            )
        model = self.models[name]
        if command is not None and model.command != command:
            raise BadRequest(
                f"model {name!r} is a {model.job.name} run; send its requests to "
                f"/v1/{model.command}"
            )
        return model

    def check_texts(self, texts: list[str], what: str) -> None:
        """Not empty, not too many, none empty or over the length limit."""
        s = self.settings
        if not texts:
            raise BadRequest(f"{what} is empty; give at least one")
        if len(texts) > s.max_inputs:
            raise BadRequest(f"{what} has {len(texts)} items; the limit is {s.max_inputs}", 413)
        for i, text in enumerate(texts):
            if not text.strip():
                raise BadRequest(f"{what}[{i}] is empty")
            if len(text) > s.max_chars:
                raise BadRequest(
                    f"{what}[{i}] has {len(text)} characters; the limit is {s.max_chars}"
                )

    def translation_sources(self, model: HostedModel, sentences: list[str]) -> list[list[int]]:
        """Subword ids with </s>; a sentence longer than the model's positions is refused."""
        translator: Any = model.predictor
        limit = translator.max_positions - 1
        for i, ids in enumerate(translator.tokenizer.encode_batch(sentences)):
            if len(ids) > limit:
                raise BadRequest(
                    f"sentences[{i}] has {len(ids)} subword tokens; model {model.name!r} "
                    f"reads at most {limit}"
                )
        return translator.encode_sources(sentences)


def read_image(upload: bytes, field: str = "image") -> Image.Image:
    """The uploaded bytes as a PIL image; anything else is 415."""
    try:
        image = Image.open(io.BytesIO(upload))
        image.load()
    except Image.DecompressionBombError:
        raise BadRequest(f"{field}: the image has too many pixels", 413) from None
    except Exception:  # PIL raises many kinds on bytes that are not an image
        raise BadRequest(f"{field}: not an image file (PNG, JPEG, ...)", 415) from None
    return image


def create_app(models: dict[str, HostedModel], settings: ServeSettings | None = None) -> FastAPI:
    """The service over ``models`` (loaded by ``qkv.serve.models.load_models``)."""
    service = Service(models, settings or ServeSettings())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        for model in models.values():
            model.batcher.start()
        yield
        await asyncio.gather(*(m.batcher.stop() for m in models.values()))

    app = FastAPI(
        title="qkv",
        summary="Translate, tag, classify and look inside the attention of trained qkv runs.",
        lifespan=lifespan,
    )
    app.add_middleware(BodyLimit, limit=service.settings.max_body_bytes)
    install(app)
    add_routes(app, service)
    return app


def add_routes(app: FastAPI, service: Service) -> None:
    s = service.settings

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> str:
        return live_page()

    @app.get("/health", summary="whether the service is up, and what its batchers have done")
    async def health() -> dict[str, Any]:
        batching = {n: vars(m.batcher.stats) for n, m in service.models.items()}
        return {"status": "ok", "models": list(service.models), "batching": batching}

    @app.get("/v1/models", summary="each hosted model: job, endpoint, sizes, languages, labels")
    async def list_models() -> dict[str, Any]:
        return {"models": [m.info() for m in service.models.values()]}

    @app.post("/v1/translate", summary="translate sentences", response_model=TranslateResponse)
    async def translate(request: TranslateRequest) -> dict[str, Any]:
        model = service.pick(request.model, "translate")
        service.check_texts(request.sentences, "sentences")
        options = model.predictor.options
        beam = options.beam_size if request.beam is None else request.beam
        penalty = (
            options.length_penalty if request.length_penalty is None else request.length_penalty
        )
        if not 1 <= beam <= s.max_beam:
            raise BadRequest(f"beam {beam}: give 1 (greedy) to {s.max_beam}")
        if not (math.isfinite(penalty) and penalty >= 0):
            raise BadRequest(f"length_penalty {penalty}: give a number of 0 or more")
        sources = service.translation_sources(model, request.sentences)
        tokens = sum(len(x) for x in sources)
        outputs = await model.batcher.submit((beam, penalty), sources, tokens)
        return {"model": model.name, "translations": outputs}

    @app.post("/v1/tag", summary="tag each word of sentences", response_model=TagResponse)
    async def tag(request: TagRequest) -> dict[str, Any]:
        model = service.pick(request.model, "tag")
        service.check_texts(request.sentences, "sentences")
        tokens = sum(2 * len(x.split()) + 1 for x in request.sentences)  # ~subwords per word
        outputs = await model.batcher.submit(None, request.sentences, tokens)
        return {"model": model.name, "tags": outputs}

    @app.post("/v1/classify", summary="label texts", response_model=ClassifyResponse)
    async def classify(request: ClassifyRequest) -> dict[str, Any]:
        model = service.pick(request.model, "classify")
        service.check_texts(request.texts, "texts")
        tokens = sum(2 * len(x.split()) + 2 for x in request.texts)
        outputs = await model.batcher.submit(None, request.texts, tokens)
        return {"model": model.name, "labels": outputs}

    @app.post("/v1/classify-image", summary="label an uploaded image", response_model=ImageResponse)
    async def classify_image(
        image: ImageUpload,
        model: ModelForm = None,
    ) -> dict[str, Any]:
        hosted = service.pick(model, "classify-image")
        picture = read_image(await image.read())
        tokens = hosted.predictor.image.n_patches + 1
        (output,) = await hosted.batcher.submit(None, [picture], tokens)
        return {"model": hosted.name, **output}

    @app.post("/v1/attention", summary="the output on one text and all its attention weights")
    async def attention(request: AttentionRequest) -> dict[str, Any]:
        model = service.pick(request.model)
        if model.reads_images:
            raise BadRequest(f"model {model.name!r} reads images; use /v1/attention-image")
        service.check_texts([request.text], "text")
        if model.command == "translate":
            service.translation_sources(model, [request.text])
        found = await model.batcher.call(model.predictor.attention, request.text)
        return {"model": model.name, **page_data(found)}

    @app.post("/v1/attention-image", summary="the label of an uploaded image and its attention")
    async def attention_image(
        image: ImageUpload,
        model: ModelForm = None,
    ) -> dict[str, Any]:
        hosted = service.pick(model, "classify-image")
        upload = await image.read()
        read_image(upload)
        with tempfile.TemporaryDirectory(prefix="qkv-serve-") as folder:
            path = Path(folder) / "upload"
            path.write_bytes(upload)
            found = await hosted.batcher.call(hosted.predictor.attention, str(path))
        found.input = image.filename or "upload"
        return {"model": hosted.name, **page_data(found)}
