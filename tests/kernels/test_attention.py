"""The Triton causal-attention kernels against the float64 torch reference.

Without CUDA they run in the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1 before `kernels` is
imported), with CUDA on the GPU. Every comparison covers the output and the gradients of q, k and v, driven by a
random upstream gradient, and every buffer the launchers allocate starts full of NaN. The public op runs the
table's launch settings; the launchers, called directly, take small tiles.
"""

import pytest
import torch
import torch.nn.functional as F
from kernel_checks import assert_stacked_runs_equal_alone
from mixlab import kernels
from mixlab.kernels import triton_utils as tu
from mixlab.kernels import utils as kutils
from mixlab.kernels.attention import causal_attention_ref
from mixlab.kernels.attention import triton as attn_triton

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
FP32, BF16, FP16 = torch.float32, torch.bfloat16, torch.float16


pytestmark = pytest.mark.usefixtures("poisoned_outputs")


def _qkv(gen: torch.Generator, B: int, H: int, T: int, hd: int, dtype: torch.dtype) -> list[torch.Tensor]:
    return [torch.randn(B, H, T, hd, generator=gen, dtype=torch.float64).to(DEVICE, dtype) for _ in range(3)]


def _fwd_bwd(qkv: list[torch.Tensor], upstream: torch.Tensor, backend: str, **kwargs) -> list[torch.Tensor]:
    """[o, dq, dk, dv] of causal_attention on fresh leaves."""
    leaves = [t.detach().clone().requires_grad_() for t in qkv]
    o = kernels.causal_attention(*leaves, backend=backend, **kwargs)
    return [o, *torch.autograd.grad(o, leaves, upstream.to(o.dtype))]


def _launch(qkv: list[torch.Tensor], upstream: torch.Tensor, config: attn_triton.Tiles,
            scale: float | None = None) -> list[torch.Tensor]:
    """[o, dq, dk, dv] through the launchers, both passes at ``config``."""
    scale = qkv[0].shape[-1] ** -0.5 if scale is None else scale
    o, lse = attn_triton._attention_fwd(*qkv, scale, config=config)
    return [o, *attn_triton._attention_bwd(upstream.to(o.dtype), *qkv, o, lse, scale, config=config)]


NAMES = ["o", "dq", "dk", "dv"]


def _check_against_reference(qkv, gen, assert_rel_rms, config: attn_triton.Tiles | None = None, **kwargs) -> None:
    """Triton output and gradients (through the public op, or the launchers at ``config``) against the float64
    reference on the same rounded inputs. A reference gradient that is exactly zero (dq and dk at T=1: the softmax
    over one key is constant) must come out zero up to rounding."""
    dtype = qkv[0].dtype
    upstream = torch.randn(qkv[0].shape, generator=gen, dtype=torch.float64).to(DEVICE, dtype)
    got = _fwd_bwd(qkv, upstream, "triton", **kwargs) if config is None else _launch(qkv, upstream, config, **kwargs)
    want = _fwd_bwd([t.double() for t in qkv], upstream.double(), "torch", **kwargs)
    for name, a, b in zip(NAMES, got, want, strict=True):
        assert a.dtype == dtype, f"{name} is {a.dtype}"
        if not b.any():
            assert a.abs().max() <= 1e-5, f"{name}: {a.abs().max():.3g} where the reference is exactly 0"
        else:
            assert_rel_rms(a, b, dtype, name)


CASES = [
    # B, H, T, head size, dtype
    pytest.param(1, 1, 1, 8, FP32, id="T1-hd8"),
    pytest.param(2, 3, 1, 16, BF16, id="bf16-T1-hd16-pairs-past-the-end"),
    pytest.param(2, 3, 63, 8, FP32, id="T63-hd8"),
    pytest.param(1, 2, 65, 16, FP32, id="T65-hd16"),
    pytest.param(1, 1, 127, 8, FP32, id="T127-hd8"),
    pytest.param(1, 2, 130, 8, FP32, id="T130-hd8-three-tiles"),
    pytest.param(1, 3, 20, 12, FP32, id="T20-hd12-not-a-power-of-two"),
    pytest.param(1, 2, 33, 32, FP32, id="T33-hd32"),
    pytest.param(1, 1, 17, 64, FP32, id="T17-hd64"),
    pytest.param(2, 2, 65, 8, BF16, id="bf16-T65-hd8"),
    pytest.param(1, 3, 127, 16, BF16, id="bf16-T127-hd16"),
    pytest.param(2, 1, 63, 8, FP16, id="fp16-T63-hd8"),
]


@pytest.mark.parametrize("B, H, T, hd, dtype", CASES)
def test_causal_attention(B, H, T, hd, dtype, assert_rel_rms):
    gen = torch.Generator().manual_seed(30)
    _check_against_reference(_qkv(gen, B, H, T, hd, dtype), gen, assert_rel_rms)


def test_custom_scale(assert_rel_rms):
    gen = torch.Generator().manual_seed(31)
    _check_against_reference(_qkv(gen, 1, 2, 40, 8, FP32), gen, assert_rel_rms, scale=1.7)


# 16-row tiles (T=65: five tiles, the last of one row) and programs of 4 pairs (B*H=5: a ragged tail)
SMALL_TILES = attn_triton.Tiles(BT=16, pair_rows=4 * 16, warps=4, stages=1)


@pytest.mark.parametrize("T", [pytest.param(65, id="T65-five-tiles"), pytest.param(9, id="T9-four-pairs")])
def test_small_tiles_and_pair_groups(T, assert_rel_rms):
    gen = torch.Generator().manual_seed(32)
    _check_against_reference(_qkv(gen, 1, 5, T, 8, FP32), gen, assert_rel_rms, config=SMALL_TILES)


def test_programs_of_several_pairs_of_several_tiles(assert_rel_rms):
    """T=65 in five 16-row tiles, two pairs a program (160 rows), B*H=5: the last program has one pair."""
    config = attn_triton.Tiles(BT=16, pair_rows=2 * 5 * 16, warps=4, stages=1)
    gen = torch.Generator().manual_seed(34)
    q, k, v = _qkv(gen, 1, 5, 65, 8, FP32)
    assert attn_triton._plan(q, config)[1]["PAIRS"] == 2
    _check_against_reference((q, k, v), gen, assert_rel_rms, config=config)


def test_config_for_has_one_row_a_pass():
    assert [attn_triton.config_for(backward) for backward in (False, True)] == list(attn_triton.CONFIGS.values())
    with pytest.raises(ValueError, match="at least 16"):
        attn_triton.Tiles(BT=8, pair_rows=128, warps=4, stages=1)


def test_poisoned_buffer_shows_an_unwritten_tile():
    """Negative control: a forward grid that misses the first row tile leaves NaN that the checks see."""
    gen = torch.Generator().manual_seed(33)
    q, k, v = _qkv(gen, 1, 1, 130, 8, FP32)
    o, lse = tu.empty(q.shape, FP32, DEVICE), tu.empty(q.shape[:3], FP32, DEVICE)
    assert torch.isnan(o).all()
    _, args = attn_triton._plan(q, attn_triton.config_for(False))
    assert args["N_TB"] == 3 and args["PAIRS"] == 1
    # one program: the longest-last order gives it the last tile
    attn_triton._attn_fwd_kernel[(1,)](q, k, v, o, lse, **args, qk_scale=1.0)
    BT = args["BT"]
    assert torch.isfinite(o[:, :, 2 * BT:]).all()
    assert torch.isnan(o[:, :, : 2 * BT]).all()


# ---- repeatability, causality, layouts ----


def test_two_calls_are_bitwise_equal():
    gen = torch.Generator().manual_seed(34)
    qkv = _qkv(gen, 2, 2, 127, 8, BF16)
    upstream = torch.randn(qkv[0].shape, generator=gen).to(DEVICE, BF16)
    first, second = _fwd_bwd(qkv, upstream, "triton"), _fwd_bwd(qkv, upstream, "triton")
    for name, a, b in zip(NAMES, first, second, strict=True):
        assert torch.equal(a, b), f"{name} differs between calls"


CAUSAL_T, CHANGED_AT = 70, 41


def _prefix_is_blind_to_the_future(fn, which: int) -> bool:
    """Whether changing input ``which`` (0 q, 1 k, 2 v) at t >= CHANGED_AT leaves fn's outputs before
    CHANGED_AT bitwise equal (the changed rows themselves must change)."""
    gen = torch.Generator().manual_seed(35)
    qkv = _qkv(gen, 1, 2, CAUSAL_T, 8, FP32)
    before = fn(*qkv)
    changed = list(qkv)
    changed[which] = qkv[which].clone()
    changed[which][:, :, CHANGED_AT:] = 5 * torch.randn(1, 2, CAUSAL_T - CHANGED_AT, 8, generator=gen).to(DEVICE)
    after = fn(*changed)
    assert not torch.equal(before[:, :, CHANGED_AT:], after[:, :, CHANGED_AT:]), "the change reached nothing"
    return torch.equal(before[:, :, :CHANGED_AT], after[:, :, :CHANGED_AT])


@pytest.mark.parametrize("which", [0, 1, 2], ids=["q", "k", "v"])
def test_outputs_before_t_ignore_inputs_from_t(which):
    assert _prefix_is_blind_to_the_future(lambda *t: kernels.causal_attention(*t, backend="triton"), which)


def test_leaky_control_is_caught():
    """Negative control: attention without the causal mask leaks the future into the prefix."""
    assert not _prefix_is_blind_to_the_future(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), 1)


def test_gradients_of_the_prefix_stop_at_its_end():
    """An upstream gradient on rows before t only: dq, dk, dv are exactly zero from t on."""
    gen = torch.Generator().manual_seed(36)
    qkv = _qkv(gen, 1, 2, CAUSAL_T, 8, FP32)
    upstream = torch.randn(1, 2, CAUSAL_T, 8, generator=gen).to(DEVICE)
    upstream[:, :, CHANGED_AT:] = 0
    _, *grads = _fwd_bwd(qkv, upstream, "triton")
    for name, grad in zip(NAMES[1:], grads, strict=True):
        assert (grad[:, :, CHANGED_AT:] == 0).all(), f"{name} reaches past the prefix"
        assert (grad[:, :, :CHANGED_AT] != 0).any(), f"{name} is zero on the prefix"


def test_layouts_give_the_same_bits():
    """The mixers' layout (transposed contiguous [B, T, H, hd]) runs without a copy and keeps its layout;
    a non-dense input (q, k, v as slices of one [B, T, 3, H, hd]) and the stride-0 upstream of o.sum() are
    copied; every result equals the contiguous call's bit for bit."""
    gen = torch.Generator().manual_seed(37)
    B, H, T, hd = 2, 3, 40, 8
    qkv = torch.randn(B, T, 3, H, hd, generator=gen).to(DEVICE)
    contiguous = [t.transpose(1, 2).contiguous() for t in qkv.unbind(2)]
    transposed = [t.contiguous().transpose(1, 2) for t in qkv.unbind(2)]
    sliced = [t.transpose(1, 2) for t in qkv.unbind(2)]
    results = []
    for layout in (contiguous, transposed, sliced):
        leaves = [t.detach().clone().requires_grad_() if t.is_contiguous() else t.detach().requires_grad_()
                  for t in layout]
        o = kernels.causal_attention(*leaves, backend="triton")
        results.append([o, *torch.autograd.grad(o.sum(), leaves)])
    assert results[1][0].stride() == transposed[0].stride()
    for got in results[1:]:
        for name, a, b in zip(NAMES, got, results[0], strict=True):
            assert torch.equal(a, b), f"{name} depends on the layout"


# ---- custom ops: registration, torch.compile, stacked runs ----


def test_custom_op_registration():
    """Schema, fake (meta) kernel, autograd registration and AOT dispatch of both custom ops."""
    gen = torch.Generator().manual_seed(38)
    q, k, v = (t.requires_grad_() for t in _qkv(gen, 2, 2, 9, 8, FP32))
    torch.library.opcheck(attn_triton._fwd_op, (q, k, v, 0.5))
    o, lse = attn_triton._fwd_op(q.detach(), k.detach(), v.detach(), 0.5)
    do = torch.randn(o.shape, generator=gen).to(DEVICE)
    torch.library.opcheck(attn_triton._bwd_op, (do, q.detach(), k.detach(), v.detach(), o, lse, 0.5))


def _attention_block(q, k, v):
    return kernels.causal_attention(q, k, v, backend="triton").sin()


def test_compiles_fullgraph_and_matches_eager():
    gen = torch.Generator().manual_seed(39)
    qkv = _qkv(gen, 2, 2, 19, 8, FP32)
    upstream = torch.randn(qkv[0].shape, generator=gen).to(DEVICE)

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in qkv]
        o = fn(*leaves)
        return [o, *torch.autograd.grad(o, leaves, upstream)]

    torch._dynamo.reset()
    compiled = torch.compile(_attention_block, fullgraph=True, backend="aot_eager")
    for name, eager, graph in zip(NAMES, run(_attention_block), run(compiled), strict=True):
        assert torch.equal(eager, graph), name


def test_vmap_over_stacked_runs_matches_each_run_alone():
    """Stacked runs (torch.func.vmap) fold into the batch: outputs and gradients are bitwise each run's alone."""
    gen = torch.Generator().manual_seed(40)
    N, B, H, T, hd = 3, 2, 2, 19, 8
    stacked = [torch.randn(N, B, H, T, hd, generator=gen).to(DEVICE) for _ in range(3)]
    upstream = torch.randn(N, B, H, T, hd, generator=gen).to(DEVICE)
    assert_stacked_runs_equal_alone(_attention_block, stacked, upstream)


# ---- reference, input checks, backend choice ----


def test_reference_matches_torch_sdpa():
    gen = torch.Generator().manual_seed(41)
    q, k, v = (t.cpu() for t in _qkv(gen, 2, 3, 17, 8, torch.float64))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.7)
    torch.testing.assert_close(causal_attention_ref(q, k, v, 0.7), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "change, message",
    [
        pytest.param({"k": torch.ones(1, 2, 6, 8)}, "k must have q's shape", id="shape"),
        pytest.param({"v": torch.ones(1, 2, 5, 8, dtype=BF16)}, "v must have q's dtype", id="dtype"),
        pytest.param({"q": torch.ones(2, 5, 8)}, "q must have 4 dimensions", id="dims"),
        pytest.param({"scale": float("nan")}, "scale must be a positive finite number", id="scale-nan"),
        pytest.param({"scale": -1.0}, "scale must be a positive finite number", id="scale-negative"),
        pytest.param({"backend": "cuda"}, "unknown backend 'cuda'", id="backend"),
    ],
)
def test_bad_inputs_raise_one_line(change, message):
    args = {"q": torch.ones(1, 2, 5, 8), "k": torch.ones(1, 2, 5, 8), "v": torch.ones(1, 2, 5, 8), **change}
    args = {name: t.to(DEVICE) if isinstance(t, torch.Tensor) else t for name, t in args.items()}
    with pytest.raises(ValueError, match=message):
        kernels.causal_attention(**args)


def test_backend_choice(monkeypatch):
    """Auto follows the device; float64 and head sizes past the kernels' largest stay on the reference,
    and an explicit backend="triton" refuses them."""
    assert "causal_attention" in kutils.TRITON_OPS
    calls = []
    monkeypatch.setattr(
        "mixlab.kernels.attention.op.causal_attention_triton", lambda *a: calls.append(1) or a[2].clone()
    )
    monkeypatch.delenv("MIXLAB_BACKEND", raising=False)
    x = torch.ones(1, 1, 3, 8, device=DEVICE)
    kernels.causal_attention(x, x, x)
    assert len(calls) == (1 if DEVICE.type == "cuda" else 0)
    kernels.causal_attention(x, x, x, backend="triton")
    wide = torch.ones(1, 1, 3, attn_triton.MAX_HEAD_DIM + 2, device=DEVICE)
    kernels.causal_attention(x.double(), x.double(), x.double())
    kernels.causal_attention(wide, wide, wide, backend=None if DEVICE.type == "cuda" else "torch")
    assert len(calls) == (2 if DEVICE.type == "cuda" else 1)
    with pytest.raises(ValueError, match="float64"):
        kernels.causal_attention(x.double(), x.double(), x.double(), backend="triton")
    with pytest.raises(ValueError, match="head sizes up to 128"):
        kernels.causal_attention(wide, wide, wide, backend="triton")
