"""Dynamic batching: concurrent requests share batches, and no output changes because of it."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from qkv.jobs import load_run
from qkv.serve.batching import Batcher
from qkv.synthetic import make_splits

from .conftest import BATCH_WAIT_MS


def sentences(n: int) -> list[str]:
    """Source sentences of varied lengths, as the tiny translator was trained on."""
    return [source for source, _ in make_splits(n, 1, 1, seed=3)["train"]]


def test_batcher_gathers_within_the_budget_and_returns_each_its_own():
    seen: list[tuple[object, list[int]]] = []

    def run(key, inputs):
        seen.append((key, list(inputs)))
        return [(key, x * 10) for x in inputs]

    async def main():
        batcher = Batcher(run, max_tokens=6, max_wait=0.05)
        batcher.start()
        try:
            requests = [([i, i + 100], "a" if i % 2 else "b") for i in range(6)]
            answers = await asyncio.gather(*(batcher.submit(k, x, 2) for x, k in requests))
        finally:
            await batcher.stop()
        return requests, answers, batcher.stats

    requests, answers, stats = asyncio.run(main())
    for (inputs, key), answer in zip(requests, answers, strict=True):
        assert answer == [(key, x * 10) for x in inputs]
    # 6 requests of 2 tokens, 6 tokens a batch: 2 batches of 3 requests, each run once per key.
    assert stats.batches == 2 and stats.requests == 6 and stats.largest_requests == 3
    assert [key for key, _ in seen] == ["b", "a", "a", "b"]
    assert seen[0] == ("b", [0, 100, 2, 102]) and seen[1] == ("a", [1, 101])


def test_a_failing_batch_fails_its_requests_only():
    def run(key, inputs):
        if key == "bad":
            raise ValueError("no")
        return inputs

    async def main():
        batcher = Batcher(run, max_tokens=100, max_wait=0.0)
        batcher.start()
        try:
            with pytest.raises(ValueError):
                await batcher.submit("bad", [1], 1)
            return await batcher.submit("good", [2], 1)
        finally:
            await batcher.stop()

    assert asyncio.run(main()) == [2]


@pytest.mark.parametrize("beam", [1, 3])
def test_the_decoder_is_batch_invariant(runs, beam):
    """A sentence decodes to the same ids alone as in a padded batch of others."""
    translator = load_run(runs["translation"][0], beam_size=beam)
    sources = translator.encode_sources(sentences(12))
    together = translator.translate_ids(sources)
    alone = [translator.translate_ids([s])[0] for s in sources]
    assert together == alone


def test_concurrent_requests_share_batches_and_answer_as_alone(service):
    texts = sentences(16)
    requests = [
        {"sentences": texts[i : i + 2], "beam": 1 if i % 4 else 3, "length_penalty": 0.6}
        for i in range(0, 16, 2)
    ]

    async def together():
        async with httpx.AsyncClient(base_url=service.url, timeout=60) as client:
            posts = [client.post("/v1/translate", json=r) for r in requests]
            answers = await asyncio.gather(*posts)
        return [a.json()["translations"] for a in answers]

    before = httpx.get(service.url + "/health").json()["batching"]["translation"]
    concurrent = asyncio.run(together())
    after = httpx.get(service.url + "/health").json()["batching"]["translation"]
    with httpx.Client(base_url=service.url, timeout=60) as client:
        alone = [
            [
                client.post("/v1/translate", json={**r, "sentences": [s]}).json()["translations"][0]
                for s in r["sentences"]
            ]
            for r in requests
        ]
    assert concurrent == alone
    # Gathered for BATCH_WAIT_MS: fewer batches than requests, some holding several.
    assert BATCH_WAIT_MS > 0
    assert after["batches"] - before["batches"] < len(requests)
    assert after["largest_requests"] > 1
