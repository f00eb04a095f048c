"""The Llama-style transformer: layers against references, attention properties, every ablation trains."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from geocont.config import ROLES, TransformerConfig, resolve
from geocont.models.layers import RMSNorm
from geocont.models.llama import Attention, Block, GatedMLP, Llama, RotaryEmbedding, apply_rope

REPO = Path(__file__).resolve().parents[1]
VOCAB = 64


def tiny(**kw) -> TransformerConfig:
    base = dict(depth=3, width=32, heads=4, kv_heads=4, mlp_width=48)
    return TransformerConfig(**{**base, **kw})


ABLATIONS = [
    pytest.param(dict(activation=a, residual=r, norm=n), id=f"{a}-{'res' if r else 'nores'}-{n}")
    for a, r, n in itertools.product(["silu", "relu", "gelu", "none"], [True, False], ["rmsnorm", "none"])
]


def ablation_model(ablation: dict, **kw) -> Llama:
    model = Llama(tiny(**ablation, **kw), VOCAB)
    if not ablation["residual"] and ablation["norm"] == "none":
        # Nothing restores the scale here: the gated MLP squares it every layer, so the 0.02 init collapses
        # the signal to ~1e-14 in 3 layers (a real property of the corner, useless for a test). Unit-scale
        # embeddings and 1/sqrt(width) projections keep it measurable.
        with torch.no_grad():
            model.embed.weight.normal_()
            for ws in model.weight_groups().values():
                for w in ws:
                    w.normal_(std=w.shape[1] ** -0.5)
    return model


def test_rmsnorm_matches_torch():
    torch.manual_seed(0)
    ours, ref = RMSNorm(24, eps=1e-6), torch.nn.RMSNorm(24, eps=1e-6)
    with torch.no_grad():
        ours.weight.normal_()
        ref.weight.copy_(ours.weight)
    x = torch.randn(3, 5, 24) * 7
    torch.testing.assert_close(ours(x), ref(x))


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    hd = 16
    cos, sin = RotaryEmbedding(hd)(40)
    q, k = torch.randn(hd), torch.randn(hd)

    def score(m: int, n: int) -> torch.Tensor:
        qm = apply_rope(q.view(1, 1, 1, hd), cos[m], sin[m])
        kn = apply_rope(k.view(1, 1, 1, hd), cos[n], sin[n])
        return (qm * kn).sum()

    for m, n, shift in [(5, 2, 7), (0, 0, 30), (3, 9, 11)]:
        torch.testing.assert_close(score(m, n), score(m + shift, n + shift))
    # A rotation keeps norms, and position matters: different offsets give different scores.
    torch.testing.assert_close(apply_rope(q.view(1, 1, 1, hd), cos[13], sin[13]).norm(), q.norm())
    assert not torch.allclose(score(5, 2), score(5, 3))


def test_rope_table_grows_and_stays_fp32():
    rope = RotaryEmbedding(8)
    cos4, _ = rope(4)
    cos9, _ = rope(9)
    torch.testing.assert_close(cos9[:4], cos4)
    rope.to(torch.bfloat16)
    assert rope(4)[0].dtype == torch.float32


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa2", "mqa"])
def test_attention_matches_explicit_masked_softmax(kv_heads):
    torch.manual_seed(0)
    cfg = tiny(kv_heads=kv_heads)
    attn = Attention(cfg)
    B, T, C, H, hd = 2, 7, cfg.width, cfg.heads, cfg.width // cfg.heads
    x = torch.randn(B, T, C)
    cos, sin = RotaryEmbedding(hd)(T)
    q = apply_rope(attn.q(x).view(B, T, H, hd).transpose(1, 2), cos, sin)
    k = apply_rope(attn.k(x).view(B, T, kv_heads, hd).transpose(1, 2), cos, sin)
    v = attn.v(x).view(B, T, kv_heads, hd).transpose(1, 2)
    # Query head h reads K/V head h // (H / kv_heads).
    k, v = k.repeat_interleave(H // kv_heads, 1), v.repeat_interleave(H // kv_heads, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
    torch.testing.assert_close(attn(x, cos, sin), attn.o(y))


@pytest.mark.parametrize("ablation", ABLATIONS)
def test_future_tokens_never_change_earlier_logits(ablation):
    torch.manual_seed(0)
    model = ablation_model(ablation, kv_heads=2).eval()
    idx = torch.randint(0, VOCAB, (2, 12))
    t = 6
    changed = idx.clone()
    changed[:, t:] = (changed[:, t:] + 1 + torch.randint(0, VOCAB - 1, changed[:, t:].shape)) % VOCAB
    with torch.no_grad():
        a, b = model(idx), model(changed)
    scale = a.abs().max()  # relative to the logits: some ablations start with tiny ones
    assert (a[:, :t] - b[:, :t]).abs().max() <= 1e-5 * scale
    assert (a[:, t] - b[:, t]).abs().max() > 1e-3 * scale  # the changed position itself does see its token


@pytest.mark.parametrize("ablation", ABLATIONS)
def test_every_ablation_trains_one_step(ablation):
    torch.manual_seed(0)
    model = ablation_model(ablation)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    idx = torch.randint(0, VOCAB, (4, 17))
    x, y = idx[:, :-1], idx[:, 1:]
    before = {role: [w.detach().clone() for w in ws] for role, ws in model.weight_groups().items()}
    logits = model(x)
    assert logits.shape == (4, 16, VOCAB)
    loss = F.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1))
    assert math.isfinite(loss.item())
    loss.backward()
    opt.step()
    for role, ws in model.weight_groups().items():
        for layer, (w, w0) in enumerate(zip(ws, before[role])):
            assert w.grad is not None and torch.isfinite(w.grad).all(), (role, layer)
            assert not torch.equal(w.detach(), w0), f"{role}[{layer}] did not move"


def test_training_lowers_the_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    model = Llama(tiny(), VOCAB)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    idx = torch.randint(0, VOCAB, (4, 17))
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(idx[:, :-1]).reshape(-1, VOCAB), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_weight_groups_roles_shapes_and_order():
    cfg = tiny(depth=4, kv_heads=1)
    model = Llama(cfg, VOCAB)
    groups = model.weight_groups()
    assert tuple(groups) == ROLES
    hd = cfg.width // cfg.heads
    shapes = {
        "q": (cfg.width, cfg.width),
        "k": (hd, cfg.width),  # one K/V head: K and V are smaller with grouped heads
        "v": (hd, cfg.width),
        "o": (cfg.width, cfg.width),
        "gate": (cfg.mlp_width, cfg.width),
        "up": (cfg.mlp_width, cfg.width),
        "down": (cfg.width, cfg.mlp_width),
    }
    params = {id(p) for p in model.parameters()}
    for role, ws in groups.items():
        assert len(ws) == cfg.depth
        assert all(tuple(w.shape) == shapes[role] and id(w) in params for w in ws)
    assert groups["q"][2] is model.blocks[2].attn.q.weight
    assert groups["down"][3] is model.blocks[3].mlp.down.weight


def test_gated_mlp_none_is_the_plain_product():
    torch.manual_seed(0)
    mlp = GatedMLP(tiny(activation="none"))
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(mlp(x), mlp.down(mlp.gate(x) * mlp.up(x)))
    swiglu = GatedMLP(tiny(activation="silu"))
    torch.testing.assert_close(swiglu(x), swiglu.down(F.silu(swiglu.gate(x)) * swiglu.up(x)))


@pytest.mark.parametrize("residual", [True, False], ids=["res", "nores"])
def test_residual_switch(residual):
    block = Block(tiny(residual=residual))
    with torch.no_grad():  # sublayers that output zero: the residual stream passes through, or nothing does
        block.attn.o.weight.zero_()
        block.mlp.down.weight.zero_()
    h = torch.randn(2, 5, 32)
    cos, sin = RotaryEmbedding(8)(5)
    expected = h if residual else torch.zeros_like(h)
    torch.testing.assert_close(block(h, cos, sin), expected)


def test_norm_none_removes_every_rmsnorm():
    with_norm = Llama(tiny(norm="rmsnorm"), VOCAB)
    without = Llama(tiny(norm="none"), VOCAB)
    assert sum(isinstance(m, RMSNorm) for m in with_norm.modules()) == 2 * 3 + 1
    assert not any(isinstance(m, RMSNorm) for m in without.modules())


@pytest.mark.parametrize("init_std", [None, 0.1, 1e-4])
def test_init_std(init_std):
    torch.manual_seed(0)
    model = Llama(tiny(width=64, mlp_width=128, init_std=init_std), VOCAB)
    expected = init_std or 0.02
    for role, ws in model.weight_groups().items():
        std = torch.cat([w.detach().flatten() for w in ws]).std().item()
        assert std == pytest.approx(expected, rel=0.1), role
    assert model.embed.weight.std().item() == pytest.approx(0.02, rel=0.1)


def _preset_model(name: str, vocab: int) -> Llama:
    cfg = resolve({"preset": name})
    return Llama(cfg.model, vocab)


@pytest.mark.parametrize("name", ["transformer-smoke", "transformer-cpu", "paper-transformer"])
def test_presets_resolve_to_language_runs(name):
    cfg = resolve({"preset": name})
    assert cfg.model.kind == "transformer"
    assert cfg.data.name in ("stdlib", "text", "wikitext103")
    assert cfg.train.max_steps and cfg.train.metrics_every_n_steps


def test_paper_preset_has_about_34m_parameters():
    cfg = resolve({"preset": "paper-transformer"})
    assert cfg.data.tokenizer == "bpe"
    with torch.device("meta"):  # count without allocating or initialising 34M weights
        model = Llama(cfg.model, cfg.data.vocab_size)
    assert 33e6 < model.num_parameters() < 35e6
    assert cfg.model.depth == 8


def test_paper_transformer_sweep_lists_the_six_table_configs():
    from geocont.sweep.grid import expand
    from geocont.sweep.load import load_sweep

    trials = expand(load_sweep(REPO / "sweeps" / "paper_transformer.yaml"))
    rows = [(t.config.model.residual, t.config.model.activation, t.config.model.norm) for t in trials]
    assert sorted(rows) == sorted(
        [
            (True, "silu", "rmsnorm"),
            (True, "relu", "rmsnorm"),
            (True, "gelu", "rmsnorm"),
            (True, "none", "rmsnorm"),
            (False, "silu", "rmsnorm"),
            (True, "silu", "none"),
        ]
    )
    assert all(t.config.preset == "transformer-cpu" for t in trials)


def test_paper_transformer_sweep_scales_up_with_one_override():
    from geocont.sweep.grid import expand
    from geocont.sweep.load import parse_sweep

    raw = yaml.safe_load((REPO / "sweeps" / "paper_transformer.yaml").read_text())
    raw["base"]["preset"] = "paper-transformer"
    trials = expand(parse_sweep(raw))
    assert len(trials) == 6
    assert {(t.config.model.depth, t.config.model.width, t.config.data.name) for t in trials} == {
        (8, 512, "wikitext103")
    }


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_autocast_step_on_gpu():
    torch.manual_seed(0)
    model = Llama(tiny(kv_heads=2), VOCAB).cuda()
    idx = torch.randint(0, VOCAB, (4, 33), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), idx[:, 1:].reshape(-1))
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(torch.isfinite(w.grad).all() for ws in model.weight_groups().values() for w in ws)
