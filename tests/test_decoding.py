import pytest
import torch
import torch.nn.functional as F

from qkv import ModelConfig, Transformer
from qkv.decoding import (
    beam_search,
    decode_step,
    greedy_search,
    max_lengths,
    prefill,
    translate_ids,
)

PAD, BOS, EOS = 0, 1, 2


def make_model(eos_bias: float = 0.0, **overrides) -> Transformer:
    """A random tiny model; ``eos_bias`` on the eos logit makes outputs end at varied lengths."""
    model = Transformer(ModelConfig.preset("tiny", dropout=0.0, **overrides)).eval()
    with torch.no_grad():
        model.output.proj.bias[EOS] += eos_bias
    return model


def padded_sources(lengths: list[int], vocab: int = 64, width: int | None = None) -> torch.Tensor:
    width = width or max(lengths)
    src = torch.randint(3, vocab, (len(lengths), width))
    src[torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None]] = PAD
    return src


def limit(n_src: int, model: Transformer, ratio: float = 1.5, add: int = 10) -> int:
    return min(int(n_src * ratio) + add, model.config.max_len - 1)


def naive_greedy(model: Transformer, src: torch.Tensor) -> list[list[int]]:
    """Greedy search that recomputes the whole prefix at every step, with no cache."""
    limits = [limit(int(n), model) for n in src.ne(PAD).sum(1)]
    outputs: list[list[int]] = [[] for _ in limits]
    done = [n == 0 for n in limits]
    prefix = torch.full((src.size(0), 1), BOS)
    for _ in range(max(limits)):
        log_probs = model.log_probs(src, prefix)[:, -1]
        log_probs[:, [BOS, PAD]] = float("-inf")
        next_tokens = log_probs.argmax(-1)
        for i, token in enumerate(next_tokens.tolist()):
            if done[i]:
                continue
            if token == EOS:
                done[i] = True
            else:
                outputs[i].append(token)
                done[i] = len(outputs[i]) >= limits[i]
        prefix = torch.cat([prefix, next_tokens[:, None]], dim=1)
    return outputs


def sequence_log_prob(
    model: Transformer, src_row: torch.Tensor, output: list[int], max_len: int
) -> float:
    """log p(output [+ eos] | src) by teacher forcing; no eos where the output hit ``max_len``."""
    ended = len(output) < max_len
    target = torch.tensor(output + [EOS] * ended)
    if target.numel() == 0:
        return 0.0
    tgt_in = torch.cat([torch.tensor([BOS]), target[:-1]])
    log_probs = model.log_probs(src_row[None], tgt_in[None])[0]  # (T, V)
    return log_probs.gather(1, target[:, None]).sum().item()


@pytest.mark.parametrize("eos_bias", [0.0, 0.5])
def test_cached_greedy_equals_recomputing_the_prefix(eos_bias):
    model = make_model(eos_bias)
    src = padded_sources([7, 4, 1, 5, 2])
    with torch.no_grad():
        expected = naive_greedy(model, src)
    assert greedy_search(model, src) == expected
    assert len({len(out) for out in expected}) > 1


def test_prefill_and_decode_step_give_the_models_last_log_probs():
    model = make_model()
    src, tgt = padded_sources([6, 3]), torch.randint(3, 64, (2, 4))
    memory, src_mask = prefill(model, src)
    model.setup_cache(2, 4)
    try:
        steps = [decode_step(model, tgt[:, t : t + 1], memory, src_mask) for t in range(4)]
    finally:
        model.remove_cache()
    torch.testing.assert_close(torch.stack(steps, 1), model.log_probs(src, tgt))
    assert steps[0].dtype == torch.float32


@pytest.mark.parametrize("eos_bias", [0.0, 0.5])
def test_beam_of_one_is_greedy(eos_bias):
    model = make_model(eos_bias)
    src = padded_sources([7, 4, 1, 5, 2, 6])
    for length_penalty in (0.0, 1.0):
        beam = beam_search(model, src, beam_size=1, length_penalty=length_penalty)
        assert beam == greedy_search(model, src)
    assert translate_ids(model, src, beam_size=1, length_penalty=0.6) == greedy_search(model, src)


@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("eos_bias", [0.0, 0.5])
def test_output_does_not_depend_on_the_rest_of_the_batch(beam_size, eos_bias):
    model = make_model(eos_bias)
    lengths = [2, 7, 1, 5, 3]
    src = padded_sources(lengths, width=9)
    together = translate_ids(model, src, beam_size=beam_size)
    alone = [
        translate_ids(model, row[None, :n], beam_size=beam_size)[0]
        for row, n in zip(src, lengths, strict=True)
    ]
    reversed_batch = translate_ids(model, src.flip(0), beam_size=beam_size)[::-1]
    assert together == alone == reversed_batch
    assert len({len(out) for out in together}) > 1


def naive_beam(model: Transformer, src_row: torch.Tensor, beam_size: int, length_penalty: float):
    """The same beam search for one sentence, in lists, recomputing every prefix (no cache)."""
    K, max_len = beam_size, limit(int(src_row.ne(PAD).sum()), model)
    beams, scores, finished = [[]], torch.zeros(1), []
    for t in range(max_len):
        prefix = torch.tensor([[BOS, *tokens] for tokens in beams])
        log_probs = model.log_probs(src_row.expand(len(beams), -1), prefix)[:, -1]
        log_probs[:, [BOS, PAD]] = float("-inf")
        totals, order = (scores[:, None] + log_probs).flatten().sort(descending=True)
        alive, alive_scores, V = [], [], log_probs.size(1)
        candidates = zip(totals[: 2 * K], order[: 2 * K].tolist(), strict=True)
        for rank, (total, index) in enumerate(candidates):
            if total.isinf():  # bos or pad, where the vocabulary is too small for 2K tokens
                break
            tokens = beams[index // V] + [index % V]
            if rank < K and (tokens[-1] == EOS or t + 1 == max_len):
                if len(finished) < K:
                    normalised = total.item() / (t + 1) ** length_penalty
                    finished.append((normalised, [x for x in tokens if x != EOS]))
            elif tokens[-1] != EOS and len(alive) < K:
                alive.append(tokens)
                alive_scores.append(total)
        if len(finished) >= K:
            break
        beams, scores = alive, torch.stack(alive_scores)
    return max(finished, key=lambda hypothesis: hypothesis[0])[1] if finished else []


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
@pytest.mark.parametrize("eos_bias", [0.0, 0.5])
@pytest.mark.parametrize(("vocab", "beam_sizes"), [(64, (2, 4)), (5, (8,))])
def test_batched_beam_search_equals_a_naive_one(vocab, beam_sizes, eos_bias, length_penalty):
    """A vocabulary of 5 has fewer real tokens than 2K candidates: beams of -inf score exist."""
    model = make_model(eos_bias, tgt_vocab_size=vocab)
    src = padded_sources([7, 4, 1, 5, 2, 6])
    for beam_size in beam_sizes:
        batched = beam_search(model, src, beam_size=beam_size, length_penalty=length_penalty)
        with torch.no_grad():
            naive = [naive_beam(model, row, beam_size, length_penalty) for row in src]
        assert batched == naive


def small_vocab_outputs(max_len: int) -> list[list[int]]:
    """Every output of 3 real tokens (ids 3, 4, 5) and up to ``max_len`` long."""
    outputs = [[]]
    for n in range(1, max_len + 1):
        outputs += [[3 + (i // 3**k) % 3 for k in range(n)] for i in range(3**n)]
    return outputs


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_beam_holding_every_prefix_finds_the_best_output(seed, length_penalty):
    """3 real tokens and 3 steps: a beam of 36 holds every candidate, so the search is exact."""
    torch.manual_seed(seed)
    model = make_model(eos_bias=1.0, tgt_vocab_size=6)
    src = padded_sources([5, 2, 7])
    options = dict(max_len_ratio=0.0, max_len_add=3)
    beam = beam_search(model, src, beam_size=36, length_penalty=length_penalty, **options)
    greedy = greedy_search(model, src, **options)

    def normalised(row: torch.Tensor, output: list[int]) -> float:
        length = min(len(output) + 1, 3)  # tokens including eos; none at the limit of 3
        return sequence_log_prob(model, row, output, max_len=3) / length**length_penalty

    with torch.no_grad():
        for row, found, greedy_output in zip(src, beam, greedy, strict=True):
            best = max(small_vocab_outputs(3), key=lambda output: normalised(row, output))
            assert found == best
            if length_penalty == 0.0:
                assert normalised(row, found) >= normalised(row, greedy_output) - 1e-5


def random_copies(n: int, vocab: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources of 3..6 random tokens, targets bos + the same tokens + eos, right-padded."""
    lengths = torch.randint(3, 7, (n,))
    src = padded_sources(lengths.tolist(), vocab, width=6)
    tgt = torch.full((n, 8), PAD)
    tgt[:, 0], tgt[:, 1:7] = BOS, src
    tgt[torch.arange(n), lengths + 1] = EOS
    return src, tgt


@pytest.fixture(scope="module")
def copy_model() -> Transformer:
    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(250):
        src, tgt = random_copies(64)
        logits = model(src, tgt[:, :-1])  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_trained_copy_model_decodes_copies(copy_model, beam_size):
    src, _ = random_copies(32)
    expected = [[token for token in row if token != PAD] for row in src.tolist()]
    outputs = translate_ids(copy_model, src, beam_size=beam_size)
    assert copy_model.training  # translate_ids restores the flag
    correct = sum(out == want for out, want in zip(outputs, expected, strict=True))
    assert correct >= 30  # a few hundred steps may leave a rare slip on other builds


@pytest.mark.parametrize("beam_size", [1, 4])
def test_outputs_stop_at_the_length_limit_and_hold_no_special_ids(beam_size):
    model = make_model(eos_bias=-1e4, max_len=24)
    with torch.no_grad():
        model.output.proj.bias[[BOS, PAD]] += 50.0  # the most probable, yet never output
    lengths = [1, 3, 6]
    src = padded_sources(lengths, width=8)
    outputs = translate_ids(model, src, beam_size=beam_size, max_len_ratio=2.0, max_len_add=1)
    assert [len(out) for out in outputs] == [3, 7, 13]
    capped = translate_ids(model, src, beam_size=beam_size, max_len_add=100)
    assert [len(out) for out in capped] == [23, 23, 23]
    none = translate_ids(model, src, beam_size=beam_size, max_len_ratio=0.0, max_len_add=0)
    assert none == [[], [], []]
    for out in outputs + capped:
        assert not {BOS, EOS, PAD} & set(out)


def test_max_lengths_count_each_sentences_own_tokens():
    model = make_model(max_len=20)
    src = padded_sources([1, 4, 7], width=10)
    limits = max_lengths(model, src, max_len_ratio=1.5, max_len_add=3, pad_id=PAD)
    assert limits.tolist() == [4, 9, 13]
    limits = max_lengths(model, src, max_len_ratio=1.5, max_len_add=10, pad_id=PAD)
    assert limits.tolist() == [11, 16, 19]


def test_translate_ids_restores_the_training_flag_and_removes_the_cache():
    model = make_model().train()
    translate_ids(model, padded_sources([3, 2]), beam_size=2)
    assert model.training
    assert model.cache_position is None
    assert all(layer.self_attn.kv_cache is None for layer in model.decoder.layers)
    with pytest.raises(ValueError, match="beam_size=0"):
        translate_ids(model, padded_sources([3]), beam_size=0)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_min_len_forces_exactly_n_new_tokens(beam_size):
    """With eos likely, min_len = the limit still gives N tokens each; min_len=0 is the default."""
    model = make_model(eos_bias=3.0)
    src = padded_sources([7, 4, 1, 5])
    free = translate_ids(model, src, beam_size=beam_size)
    assert min(len(out) for out in free) < 12  # eos would end some outputs early
    assert translate_ids(model, src, beam_size=beam_size, min_len=0) == free
    forced = translate_ids(
        model, src, beam_size=beam_size, max_len_ratio=0.0, max_len_add=12, min_len=12
    )
    assert [len(out) for out in forced] == [12, 12, 12, 12]
    for out in forced:
        assert not {BOS, EOS, PAD} & set(out)
