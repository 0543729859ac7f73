"""Every endpoint of the service, and every bad request it must refuse without falling over."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from qkv.jobs import load_run
from qkv.serve.errors import validation_message
from qkv.viz.page import page_data


def image_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def error_of(response, status: int) -> str:
    """The message of an error answer, after checking its status and that it is JSON."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]
    assert "Traceback" not in response.text and 'File "' not in response.text
    return body["error"]


def test_health_and_models(client, runs):
    health = client.get("/health").json()
    assert health["status"] == "ok"
    assert health["models"] == ["translation", "tagger", "classifier", "vit"]
    models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    assert {n: m["job"] for n, m in models.items()} == {
        "translation": "translation",
        "tagger": "tagger",
        "classifier": "classifier",
        "vit": "vit",
    }
    translation = models["translation"]
    assert translation["endpoint"] == "/v1/translate" and translation["input"] == "text"
    assert translation["languages"] == {"source": "src", "target": "tgt"}
    assert translation["sizes"]["n_heads"] == 2 and translation["sizes"]["n_decoder_layers"] == 1
    assert translation["sizes"]["parameters"] > 0 and "labels" not in translation
    assert models["classifier"]["labels"] == ["neg", "pos"]
    assert "NOUN" in models["tagger"]["labels"]
    assert models["vit"]["input"] == "image" and models["vit"]["endpoint"] == "/v1/classify-image"
    assert models["vit"]["labels"] == [str(d) for d in range(10)]


def test_translate_matches_the_translator(client, runs):
    sentences = ["the dog sees a cat", "a cat sees the dog"]
    translator = load_run(runs["translation"][0], beam_size=2, length_penalty=0.6)
    answer = client.post(
        "/v1/translate",
        json={"model": "translation", "sentences": sentences, "beam": 2, "length_penalty": 0.6},
    )
    assert answer.status_code == 200, answer.text
    expected = translator.translate(sentences)
    assert answer.json() == {"model": "translation", "translations": expected}
    # The model may be left out when only one hosted model translates.
    default = client.post("/v1/translate", json={"sentences": sentences}).json()
    assert default["translations"] == load_run(runs["translation"][0]).translate(sentences)


def test_tag_and_classify(client, runs):
    sentence = runs["tagger"][1]
    tags = client.post("/v1/tag", json={"model": "tagger", "sentences": [sentence]}).json()
    expected = load_run(runs["tagger"][0]).tag([sentence])[0]
    assert [(x["word"], x["tag"]) for x in tags["tags"][0]] == expected
    texts = [runs["classifier"][1], "a dull film"]
    labels = client.post("/v1/classify", json={"texts": texts}).json()["labels"]
    expected = load_run(runs["classifier"][0]).predict(texts)
    assert [x["label"] for x in labels] == [label for label, _ in expected]
    np.testing.assert_allclose([x["probability"] for x in labels], [p for _, p in expected])


def test_classify_image(client, runs):
    folder, png = runs["vit"]
    files = {"image": ("digit.png", image_bytes(png))}
    answer = client.post("/v1/classify-image", data={"model": "vit"}, files=files)
    assert answer.status_code == 200, answer.text
    label, probability = load_run(folder).predict([png])[0]
    assert answer.json()["label"] == label
    assert answer.json()["probability"] == pytest.approx(probability)


@pytest.mark.parametrize("job", ["translation", "tagger", "classifier"])
def test_attention_is_the_explorer_data(client, runs, job):
    folder, text = runs[job]
    answer = client.post("/v1/attention", json={"model": job, "text": text})
    assert answer.status_code == 200, answer.text
    expected = page_data(load_run(folder).attention(text))
    assert answer.json() == {"model": job, **json.loads(json.dumps(expected))}


def test_attention_of_an_image(client, runs):
    folder, png = runs["vit"]
    files = {"image": ("digit.png", image_bytes(png))}
    answer = client.post("/v1/attention-image", data={"model": "vit"}, files=files).json()
    expected = page_data(load_run(folder).attention(png))
    assert answer["input"] == "digit.png" and answer["output"] == expected["output"]
    assert answer["image"] == expected["image"] and answer["kinds"] == expected["kinds"]


def test_openapi_documents_every_endpoint(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path in (
        "/v1/translate",
        "/v1/tag",
        "/v1/classify",
        "/v1/classify-image",
        "/v1/attention",
        "/v1/attention-image",
        "/v1/models",
        "/health",
    ):
        assert path in paths
    assert client.get("/docs").status_code == 200


def test_page_is_offline(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "http://" not in page.text and "https://" not in page.text
    assert "<script src" not in page.text and '<link rel="stylesheet"' not in page.text
    assert 'id="explorer-template"' in page.text and 'id="heatmap"' in page.text


JSON = {"content-type": "application/json"}
PNG = ("x.png", b"this is not an image", "image/png")
LONG_WORDS = " ".join(["dog"] * 700)  # more subwords than the tiny translator has positions


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "words"),
    [
        ("post", "/v1/translate", {"content": b"{a", "headers": JSON}, 422, "not valid JSON"),
        ("post", "/v1/translate", {"content": b"{not json"}, 422, "body: Input should be"),
        ("post", "/v1/translate", {"json": {"sentences": "a dog"}}, 422, "sentences"),
        ("post", "/v1/translate", {"json": {"sentences": [1, 2]}}, 422, "sentences.0"),
        ("post", "/v1/translate", {"json": {"sentences": ["a"], "beam": "x"}}, 422, "beam"),
        ("post", "/v1/translate", {"json": {"sentences": ["a"], "beam": 99}}, 422, "beam 99"),
        ("post", "/v1/translate", {"json": {"sentences": []}}, 422, "sentences is empty"),
        ("post", "/v1/translate", {"json": {"sentences": ["a", " "]}}, 422, "sentences[1]"),
        ("post", "/v1/translate", {"json": {}}, 422, "sentences: Field required"),
        ("post", "/v1/translate", {"json": {"sentences": ["x" * 3001]}}, 422, "3001 characters"),
        ("post", "/v1/translate", {"json": {"sentences": [LONG_WORDS]}}, 422, "subword tokens"),
        ("post", "/v1/translate", {"json": {"sentences": ["a"] * 65}}, 413, "limit is 64"),
        ("post", "/v1/translate", {"content": b"[" * 300_000}, 413, "over the limit"),
        ("post", "/v1/translate", {"json": {"model": "nope", "sentences": ["a"]}}, 404, "nope"),
        ("post", "/v1/tag", {"json": {"model": "translation", "sentences": ["a"]}}, 422, "/v1/t"),
        ("post", "/v1/tag", {"json": {"sentences": [""]}}, 422, "sentences[0] is empty"),
        ("post", "/v1/classify", {"json": {"texts": None}}, 422, "texts"),
        ("post", "/v1/attention", {"json": {"text": "a dog"}}, 422, "name the model"),
        ("post", "/v1/attention", {"json": {"model": "vit", "text": "a"}}, 422, "reads images"),
        ("post", "/v1/attention", {"json": {"model": "tagger", "text": ""}}, 422, "text[0]"),
        ("post", "/v1/classify-image", {"files": {"image": PNG}}, 415, "not an image"),
        ("post", "/v1/classify-image", {"data": {"model": "vit"}}, 422, "image"),
        ("post", "/v1/attention-image", {"files": {"image": PNG}}, 415, "not an image"),
        ("get", "/v1/nothing", {}, 404, "Not Found"),
        ("get", "/v1/translate", {}, 405, "Method Not Allowed"),
    ],
)
def test_bad_requests_get_one_message(client, method, path, kwargs, status, words):
    answer = getattr(client, method)(path, **kwargs)
    assert words in error_of(answer, status)
    assert client.get("/health").json()["status"] == "ok"  # and the service goes on


def test_a_chunked_body_over_the_limit_is_refused(client):
    def chunks():
        for _ in range(30):
            yield b"x" * 10_000

    answer = client.post("/v1/translate", content=chunks())
    assert "over the limit" in error_of(answer, 413)


def test_validation_messages_are_short():
    errors = [
        {"loc": ("body", "sentences", i), "msg": "Input should be a valid string"} for i in range(5)
    ]
    message = validation_message(errors)
    assert message.startswith("sentences.0: Input should be a valid string")
    assert message.endswith("(and 2 more)")


def test_a_failing_model_is_a_500_without_traceback(client, service, monkeypatch):
    tagger = service.models["tagger"].predictor

    def broken(sentences):
        raise RuntimeError("deep inside")

    monkeypatch.setattr(tagger, "tag", broken)
    answer = client.post("/v1/tag", json={"sentences": ["a dog"]})
    message = error_of(answer, 500)
    assert "deep inside" not in message
    monkeypatch.undo()
    assert client.post("/v1/tag", json={"sentences": ["a dog"]}).status_code == 200


def test_image_is_converted_as_a_file_would_be(client, runs, tmp_path):
    from PIL import Image

    rgb = Image.fromarray((np.random.default_rng(0).random((20, 30, 3)) * 255).astype(np.uint8))
    buffer = io.BytesIO()
    rgb.save(buffer, format="JPEG")
    path = tmp_path / "rgb.jpg"
    path.write_bytes(buffer.getvalue())
    answer = client.post("/v1/classify-image", files={"image": ("rgb.jpg", buffer.getvalue())})
    assert answer.json()["label"] == load_run(runs["vit"][0]).predict([str(path)])[0][0]
