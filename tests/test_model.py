import importlib

import pytest
import torch
from torch.testing import assert_close

from qkv import EncoderModel, ModelConfig, Transformer


def padded_batch(config, lengths, max_len=None):
    max_len = max_len or max(lengths)
    tokens = torch.randint(1, config.src_vocab_size, (len(lengths), max_len))
    for row, n in enumerate(lengths):
        tokens[row, n:] = config.pad_id
    return tokens


@pytest.fixture
def model():
    return Transformer(ModelConfig.preset("tiny")).eval()


def test_forward_shapes_and_log_softmax(model):
    src, tgt = padded_batch(model.config, [6, 3]), padded_batch(model.config, [4, 4])
    logits = model(src, tgt)
    assert logits.shape == (2, 4, model.config.tgt_vocab_size)
    assert_close(model.log_probs(src, tgt).exp().sum(-1), torch.ones(2, 4))


def test_encode_once_decode_many(model):
    src, tgt = padded_batch(model.config, [6, 3]), padded_batch(model.config, [4, 4])
    memory = model.encode(src)
    assert memory.shape == (2, 6, model.config.d_model)
    assert_close(model.decode(tgt, memory, model.src_mask(src)), model(src, tgt))


def test_source_padding_does_not_change_the_output(model):
    src = padded_batch(model.config, [3])
    tgt = padded_batch(model.config, [4])
    longer = torch.cat([src, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    assert_close(model(src, tgt), model(longer, tgt))


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_equals_recomputing_the_prefix(norm_first):
    config = ModelConfig.preset("tiny", norm_first=norm_first)
    model = Transformer(config).eval()
    src = padded_batch(config, [7, 4, 2])
    tgt = padded_batch(config, [6, 6, 6])
    src_mask = model.src_mask(src)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)  # (B, T, V), whole prefix recomputed
        model.setup_cache(batch_size=3, max_len=16)
        steps = [model.decode(tgt[:, t : t + 1], memory, src_mask) for t in range(6)]
        assert_close(torch.cat(steps, 1), full)
        # a prefill of several positions, then single steps, agrees too
        model.reset_cache()
        prefill = model.decode(tgt[:, :4], memory, src_mask)
        rest = [model.decode(tgt[:, t : t + 1], memory, src_mask) for t in (4, 5)]
        assert_close(torch.cat([prefill, *rest], 1), full)
    # the cross-attention keys and values were computed once per source
    cross = model.decoder.layers[0].cross_attn
    assert cross.memory_kv is not None and cross.memory_kv[0].shape[2] == 7
    model.remove_cache()
    assert model.decoder.layers[0].self_attn.kv_cache is None


def test_reorder_cache_follows_the_chosen_rows(model):
    config = model.config
    src, tgt = padded_batch(config, [5, 3]), padded_batch(config, [3, 3])
    with torch.no_grad():
        memory, mask = model.encode(src), model.src_mask(src)
        model.setup_cache(2, 8)
        for t in range(2):
            model.decode(tgt[:, t : t + 1], memory, mask)
        index = torch.tensor([1, 1])
        model.reorder_cache(index)
        step = model.decode(tgt[index][:, 2:3], memory[index], mask[index])
        model.remove_cache()
        full = model.decode(tgt[index], memory[index], mask[index])
    assert_close(step[:, 0], full[:, 2])


def test_attention_maps_cover_every_layer_and_head(model):
    config = model.config
    src, tgt = padded_batch(config, [6, 2]), padded_batch(config, [3, 3])
    maps = model.attention_maps(src, tgt)
    L, H = config.n_encoder_layers, config.n_heads
    assert maps["encoder"].shape == (L, 2, H, 6, 6)
    assert maps["decoder"].shape == (config.n_decoder_layers, 2, H, 3, 3)
    assert maps["cross"].shape == (config.n_decoder_layers, 2, H, 3, 6)
    assert_close(maps["cross"].sum(-1), torch.ones(config.n_decoder_layers, 2, H, 3))
    assert (maps["cross"][:, 1, :, :, 2:] == 0).all()  # padding gets no attention
    assert_close(maps["logits"], model(src, tgt))


def test_default_path_never_computes_weights(model, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the reference path ran without being asked for")

    attention_module = importlib.import_module("qkv.attention")  # not the re-exported function
    monkeypatch.setattr(attention_module, "reference_attention", refuse)
    src, tgt = padded_batch(model.config, [6, 3]), padded_batch(model.config, [4, 4])
    model(src, tgt)
    with pytest.raises(AssertionError, match="reference path"):
        model.attention_maps(src, tgt)


def test_reference_and_fast_models_agree():
    config = ModelConfig.preset("tiny")
    fast = Transformer(config).eval()
    slow = Transformer(ModelConfig.preset("tiny", attention_impl="reference")).eval()
    slow.load_state_dict(fast.state_dict())
    src, tgt = padded_batch(config, [6, 3]), padded_batch(config, [4, 4])
    assert_close(fast(src, tgt), slow(src, tgt))


def test_training_step_reduces_loss():
    config = ModelConfig.preset("tiny", dropout=0.0)
    model = Transformer(config)
    src, tgt = padded_batch(config, [5, 5]), padded_batch(config, [5, 5])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_encoder_model_shapes_and_attention():
    config = ModelConfig.preset("tiny")
    model = EncoderModel(config).eval()
    tokens = padded_batch(config, [5, 2])
    weights = []
    out = model(tokens, attentions=weights)
    assert out.shape == (2, 5, config.d_model)
    assert len(weights) == config.n_encoder_layers
    assert (weights[0][1, :, :, 2:] == 0).all()


def test_selected_positions_equal_the_full_logits_there(model):
    src = torch.randint(1, 64, (3, 7))
    tgt = torch.randint(1, 64, (3, 5))
    select = torch.rand(3, 5) < 0.6
    select[0, 0] = True
    full = model(src, tgt)  # (B, T, V)
    picked = model(src, tgt, select=select)  # (N, V)
    assert picked.shape == (int(select.sum()), full.size(-1))
    torch.testing.assert_close(picked, full[select])


def test_the_translation_loss_scores_real_tokens_only_and_equals_the_padded_loss():
    from qkv.jobs.translation.data import make_translation_batch
    from qkv.jobs.translation.task import TranslationTask

    model = Transformer(ModelConfig.preset("tiny")).eval()
    batch = make_translation_batch([[5, 6, 7], [8]], [[9, 10, 11, 12], [13]])
    task = TranslationTask.__new__(TranslationTask)
    task.label_smoothing, task.word_dropout = 0.1, 0.0
    loss, tokens = task.loss(model, batch)
    logits = model(batch.src, batch.tgt_in)  # the padded reference: every position scored
    reference = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0, label_smoothing=0.1
    )
    assert tokens == 5 + 2
    torch.testing.assert_close(loss, reference)
