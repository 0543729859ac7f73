"""The plain peer of benchmarks/speed.py is a real translation model (no timings here)."""

import pytest
import torch
from benchmarks.peers.translation import PeerTranslator, peer_loss

from qkv.interop import transformer_from_torch

# torch.nn.Transformer's own notes about nested tensors, which the peer does not use.
pytestmark = [
    pytest.mark.filterwarnings("ignore:enable_nested_tensor:UserWarning"),
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning"),
]

PAD, BOS, EOS, V = 0, 1, 2, 40
SIZES = dict(d_model=32, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=64)


def make_peer(**overrides) -> PeerTranslator:
    return PeerTranslator(V, **{**SIZES, "dropout": 0.0, **overrides})


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sources and targets of 3 sentences, right-padded; tgt_in is bos + tgt_out's tokens."""
    src = torch.randint(3, V, (3, 7))
    src[0, 5:], src[2, 3:] = PAD, PAD
    tgt_out = torch.randint(3, V, (3, 6))
    tgt_out[:, -1] = EOS
    tgt_out[1, 4:] = torch.tensor([EOS, PAD])
    tgt_in = torch.cat([torch.full((3, 1), BOS), tgt_out[:, :-1]], dim=1)
    tgt_in[1, 5] = PAD
    return src, tgt_in, tgt_out


@pytest.mark.parametrize("norm_first", [True, False])
def test_the_peer_computes_what_qkv_computes_with_the_same_weights(norm_first):
    peer = make_peer(norm_first=norm_first).eval()
    model = transformer_from_torch(
        peer.transformer,
        src_vocab_size=V,
        tgt_vocab_size=V,
        share_embeddings=True,
        tie_output=True,
    ).eval()
    with torch.no_grad():
        model.src_embed.token.weight.copy_(peer.embedding.weight)
        model.output.proj.bias.copy_(peer.output.bias)
    src, tgt_in, _ = batch()
    with torch.no_grad():
        logits = peer(src, tgt_in)
        assert logits.shape == (3, 6, V)
        assert logits.isfinite().all()
        real = tgt_in != PAD  # qkv leaves padded target queries unmasked; compare real ones
        torch.testing.assert_close(logits[real], model(src, tgt_in)[real], atol=1e-4, rtol=1e-4)


def test_the_peers_loss_falls_on_a_tiny_batch():
    peer = make_peer()
    src, tgt_in, tgt_out = batch()
    optimizer = torch.optim.AdamW(peer.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = peer_loss(peer, src, tgt_in, tgt_out, label_smoothing=0.1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_the_peer_is_causal_and_ignores_padding():
    peer = make_peer().eval()
    src, tgt_in, _ = batch()
    with torch.no_grad():
        logits = peer(src, tgt_in)
        changed = tgt_in.clone()
        changed[:, 3] = (changed[:, 3] + 1 - 3) % (V - 3) + 3  # another real token at 3
        later = peer(src, changed)
        torch.testing.assert_close(later[:, :3], logits[:, :3])
        assert not torch.allclose(later[:, 3:], logits[:, 3:])
        more_padding = torch.cat([src, torch.full((3, 4), PAD)], dim=1)
        torch.testing.assert_close(peer(more_padding, tgt_in), logits)


def test_the_peers_greedy_decoder_picks_what_qkvs_picks_with_the_same_weights():
    from benchmarks.peers.translation import translate

    from qkv.decoding import translate_ids

    torch.manual_seed(3)
    peer = make_peer()  # trained a little to copy, so that its outputs vary
    optimizer = torch.optim.AdamW(peer.parameters(), lr=3e-3)
    for _ in range(80):
        src = torch.randint(3, 12, (16, 6))
        src[:, -1] = EOS
        tgt_in = torch.cat([torch.full((16, 1), BOS), src[:, :-1]], dim=1)
        loss = peer_loss(peer, src, tgt_in, src, label_smoothing=0.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    peer.eval()
    model = transformer_from_torch(
        peer.transformer, src_vocab_size=V, tgt_vocab_size=V, share_embeddings=True,
        tie_output=True,
    ).eval()  # fmt: skip
    with torch.no_grad():
        model.src_embed.token.weight.copy_(peer.embedding.weight)
        model.output.proj.bias.copy_(peer.output.bias)
    sources = [torch.randint(3, 12, (n,)).tolist() + [EOS] for n in (4, 7, 2, 5)]
    theirs = translate(peer, sources, beam=1, batch_size=3)
    src = torch.full((4, 8), PAD)
    for r, row in enumerate(sources):
        src[r, : len(row)] = torch.tensor(row)
    ours = [[t for t in row if t != EOS] for row in translate_ids(model, src)]
    assert len({tuple(row) for row in ours}) == 4  # four different outputs
    for a, b in zip(ours, theirs, strict=True):
        n = min(len(a), len(b))  # the two cap lengths differently
        assert n >= 3 and a[:n] == b[:n]
    beams = translate(peer, sources, beam=3, batch_size=3)
    assert all(row and all(3 <= t < V for t in row) for row in beams)
