"""Dynamic batching: requests that arrive together are decoded together.

Each hosted model has one ``Batcher`` and one worker thread. A request hands its inputs to
``Batcher.submit`` and waits. The batcher takes the first waiting request, gathers more for up
to ``max_wait`` seconds or until the gathered inputs fill the token budget, and runs them as one
call on the worker thread; each request then gets back exactly its own outputs.

Gathering never changes an output: inputs that need different settings (a translation's beam
size and length penalty) are run apart, and the models decode each input the same alone or in
any batch (``qkv.decoding``; padding is masked and each length limit is the input's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

# run(key, inputs) -> one output per input: the model's batched prediction.
RunBatch = Callable[[Hashable, list[Any]], list[Any]]


@dataclass
class Request:
    """One request's inputs, their size in tokens, and where its outputs go."""

    key: Hashable
    inputs: list[Any]
    tokens: int
    done: asyncio.Future = field(repr=False)


@dataclass
class BatchStats:
    """What the batcher has done: batches run, requests and inputs in them, the largest."""

    batches: int = 0
    requests: int = 0
    inputs: int = 0
    largest_requests: int = 0
    largest_inputs: int = 0

    def add(self, requests: Sequence[Request]) -> None:
        n = sum(len(r.inputs) for r in requests)
        self.batches += 1
        self.requests += len(requests)
        self.inputs += n
        self.largest_requests = max(self.largest_requests, len(requests))
        self.largest_inputs = max(self.largest_inputs, n)


class Batcher:
    """Gathers concurrent requests for one model and runs them as batches on its own thread.

    Args:
        run: the batched prediction, ``run(key, inputs) -> outputs``; called on the worker
            thread only, so a model is never used by two threads at once.
        max_tokens: the token budget of one gathered batch (a larger request runs alone).
        max_wait: seconds to wait for more requests after the first one arrives.
    """

    def __init__(self, run: RunBatch, max_tokens: int, max_wait: float) -> None:
        self.run = run
        self.max_tokens = max_tokens
        self.max_wait = max_wait
        self.stats = BatchStats()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qkv-model")
        self._queue: asyncio.Queue[Request] | None = None
        self._held: Request | None = None  # gathered past the budget: first of the next batch
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Start gathering on the running event loop."""
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop gathering (after the requests in flight are answered) and end the thread."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.executor.shutdown(wait=True)

    async def submit(self, key: Hashable, inputs: list[Any], tokens: int) -> list[Any]:
        """The outputs of ``inputs`` (run with settings ``key``), in order."""
        if self._queue is None:
            raise RuntimeError("the batcher has not been started")
        done = asyncio.get_running_loop().create_future()
        await self._queue.put(Request(key, inputs, max(tokens, 1), done))
        return await done

    async def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on the model's thread, between batches (e.g. attention)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def _gather(self) -> list[Request]:
        """The next batch: the first request, then whatever arrives within the budget."""
        assert self._queue is not None
        first = self._held or await self._queue.get()
        self._held = None
        batch, tokens = [first], first.tokens
        deadline = time.monotonic() + self.max_wait
        while tokens < self.max_tokens:
            try:
                if self._queue.empty():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    request = await asyncio.wait_for(self._queue.get(), left)
                else:
                    request = self._queue.get_nowait()
            except asyncio.TimeoutError:
                break
            if tokens + request.tokens > self.max_tokens:
                self._held = request
                break
            batch.append(request)
            tokens += request.tokens
        return batch

    async def _loop(self) -> None:
        while True:
            batch = await self._gather()
            batch = [r for r in batch if not r.done.cancelled()]  # their clients left
            if not batch:
                continue
            self.stats.add(batch)
            try:
                outputs = await self.call(run_grouped, self.run, batch)
            except Exception as error:  # the requests fail; the batcher goes on
                for request in batch:
                    if not request.done.done():
                        request.done.set_exception(error)
                continue
            for request, output in zip(batch, outputs, strict=True):
                if not request.done.done():
                    request.done.set_result(output)


def run_grouped(run: RunBatch, batch: Sequence[Request]) -> list[list[Any]]:
    """Run the requests' inputs, one call per settings key; outputs per request, in order."""
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, request in enumerate(batch):
        groups[request.key].append(i)
    outputs: list[list[Any]] = [[] for _ in batch]
    for key, members in groups.items():
        inputs = [x for i in members for x in batch[i].inputs]
        results = run(key, inputs)
        if len(results) != len(inputs):
            raise RuntimeError(f"{len(inputs)} inputs gave {len(results)} outputs")
        start = 0
        for i in members:
            n = len(batch[i].inputs)
            outputs[i] = list(results[start : start + n])
            start += n
    return outputs
