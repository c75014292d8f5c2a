"""The lab's plain-torch ``chunk_bwd_dqkwg`` (models/mixers/fla_dqkwg.py) against fla-core's Triton kernel run by
the Triton interpreter (fp32: the interpreter computes what the kernel means, which Hopper with Triton 3.4-3.7.0
miscompiles), and its registration in fla's backend registry. The whole delta-rule backward with it runs on the
GPU (tests/kernels/test_gpu_fla.py): fla's chunked forward kernels do not run under the interpreter."""

import pytest
import torch
from kernel_checks import RMS_BOUND, assert_close, cu_from_rows
from mixlab.models import ModelConfig
from mixlab.models.mixers import fla_ops
from mixlab.runners.train.provenance import package_versions

pytestmark = pytest.mark.skipif(not fla_ops.fla_available(),
                                reason=f"fla-core is not installed ({fla_ops.INSTALL_HINT})")

K, V = 8, 16
NAMES = ("dq", "dk", "dw", "dg")

# (B, T, chunk, document lengths per row or None)
CASES = {
    "T1": (2, 1, 16, None),
    "T63-chunk16": (1, 63, 16, None),
    "T65-chunk64": (2, 65, 64, None),
    "T127-chunk64": (1, 127, 64, None),
    "docs-shorter-than-chunk": (1, 40, 16, [[3, 1, 9, 27]]),
    "docs-empty": (1, 40, 16, [[0, 17, 0, 23, 0]]),
    "docs-several-rows": (3, 33, 16, [[33], [1, 32], [16, 16, 1]]),
}


def inputs(B, T, chunk, rows, dtype=torch.float32, heads=2, state_v_first=False, seed=0):
    """fla's arguments at these shapes: random tensors, the states of each chunk, a decreasing log2 gate."""
    from fla.ops.utils import prepare_chunk_indices

    gen = torch.Generator().manual_seed(seed)
    cu = cu_from_rows(rows, T)
    if cu is not None:  # documents: fla's varlen layout, one row of B * T tokens
        B, T = 1, B * T
    n_chunks = len(prepare_chunk_indices(cu.long(), chunk)) if cu is not None else -(-T // chunk)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    state = (V, K) if state_v_first else (K, V)
    return dict(
        q=rand(B, T, heads, K), k=rand(B, T, heads, K), v=rand(B, T, heads, V), do=rand(B, T, heads, V),
        h=rand(B, n_chunks, heads, *state), dh=rand(B, n_chunks, heads, *state), dv=rand(B, T, heads, V),
        w=rand(B, T, heads, K), g=-torch.rand(B, T, heads, generator=gen).cumsum(1) * 0.2, scale=0.3,
        chunk_size=chunk, state_v_first=state_v_first, cu_seqlens=None if cu is None else cu.long(),
    )


def fla_kernel(**kw):
    fla_ops.load_fla()
    from fla.ops.common.chunk_o import chunk_bwd_dqkwg

    return chunk_bwd_dqkwg(**kw)


@pytest.mark.parametrize("case", CASES)
def test_matches_fla_kernel_interpreted(case):
    from mixlab.models.mixers.fla_dqkwg import chunk_bwd_dqkwg_torch

    kw = inputs(*CASES[case])
    want = fla_kernel(**kw)
    got = chunk_bwd_dqkwg_torch(**kw)
    for name, a, b in zip(NAMES, got, want, strict=True):
        assert a.dtype == b.dtype, name
        assert_close(a, b, torch.float32, f"{case} {name}")


@pytest.mark.parametrize("variant", ["state_v_first", "no_w"])
def test_variants_match_fla_kernel_interpreted(variant):
    from mixlab.models.mixers.fla_dqkwg import chunk_bwd_dqkwg_torch

    kw = inputs(2, 65, 16, None, state_v_first=variant == "state_v_first")
    if variant == "no_w":
        kw["w"] = None
    want, got = fla_kernel(**kw), chunk_bwd_dqkwg_torch(**kw)
    for name, a, b in zip(NAMES, got, want, strict=True):
        if b is None:
            assert a is None, name
            continue
        assert_close(a, b, torch.float32, f"{variant} {name}")


def test_bf16_inputs_round_like_fp32_on_the_same_values():
    """The interpreter cannot run fla's kernel on bf16 tensors; the torch form on bf16 inputs is checked against
    itself on the same values in fp32, within the bf16 bound (its own rounding of ds and of the results)."""
    from mixlab.models.mixers.fla_dqkwg import chunk_bwd_dqkwg_torch

    kw = inputs(1, 40, 16, [[3, 1, 9, 27]], dtype=torch.bfloat16)
    got = chunk_bwd_dqkwg_torch(**kw)
    as32 = {n: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for n, t in kw.items()}
    want = chunk_bwd_dqkwg_torch(**as32)
    for name, a, b in zip(NAMES, got, want, strict=True):
        assert a.dtype == (torch.float32 if name == "dg" else torch.bfloat16), name
        assert_close(a, b, RMS_BOUND[torch.bfloat16], f"bf16 {name}")


def test_refuses_what_it_does_not_cover():
    from mixlab.models.mixers.fla_dqkwg import chunk_bwd_dqkwg_torch

    kw = inputs(1, 20, 16, None)
    with pytest.raises(ValueError, match="per-token gate"):
        chunk_bwd_dqkwg_torch(**{**kw, "g": None})
    with pytest.raises(ValueError, match="value heads"):
        chunk_bwd_dqkwg_torch(**{**kw, "v": kw["v"].repeat(1, 1, 2, 1)})


def test_registered_backend_takes_the_gated_calls_only(monkeypatch):
    """Once registered, fla's own ``chunk_bwd_dqkwg`` hands its gated calls to the torch form (a spy counts them)
    and keeps the ungated ones."""
    fla_ops.load_fla()
    from fla.backends import _get_operation_registry
    from fla.ops.common.chunk_o import chunk_bwd_dqkwg
    from mixlab.models.mixers import fla_dqkwg

    registry = _get_operation_registry("common")
    monkeypatch.setattr(registry, "_backends", dict(registry._backends))  # undone after the test
    calls = []
    real = fla_dqkwg.chunk_bwd_dqkwg_torch
    monkeypatch.setattr(fla_dqkwg, "chunk_bwd_dqkwg_torch", lambda **kw: calls.append(1) or real(**kw))
    monkeypatch.setattr(fla_dqkwg, "_registered", False)  # the flag and the registry are restored after the test
    fla_dqkwg.register()
    kw = inputs(1, 20, 16, None)
    got = chunk_bwd_dqkwg(**kw)
    assert calls == [1]
    torch.testing.assert_close(got[0], real(**kw)[0], rtol=0, atol=0)
    chunk_bwd_dqkwg(**{**kw, "g": None, "w": None})
    assert calls == [1]
    # records name the stand-in where their model's backward runs it: the gated delta rule on fla's kernels
    stand_in = "fla-core chunk_bwd_dqkwg"

    def versions(mixer, **kw):
        return package_versions(ModelConfig(vocab_size=8, mixer=mixer, **kw))

    assert versions("gated_delta_net")[stand_in] == "mixlab plain torch"
    assert versions("hyena,gated_delta_net", n_layers=2)[stand_in] == "mixlab plain torch"
    assert stand_in not in versions("based")
    assert stand_in not in versions("gated_delta_net", kernel_backend="torch")
    assert stand_in not in package_versions()


@pytest.mark.parametrize("case", ["T65-chunk64", "docs-empty"])
def test_reads_nothing_on_the_host(case):
    """Every shape follows from the arguments' shapes, none from their values: under fake tensors (no data) a
    boolean-mask index or ``.item()``, each a device sync per call on the GPU, raises."""
    from fla.ops.utils import prepare_chunk_indices
    from mixlab.models.mixers.fla_dqkwg import chunk_bwd_dqkwg_torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    kw = inputs(*CASES[case])
    if kw["cu_seqlens"] is not None:  # fla passes the chunk list it prepared once (on the host) with the offsets
        kw["chunk_indices"] = prepare_chunk_indices(kw["cu_seqlens"], kw["chunk_size"])
    real = chunk_bwd_dqkwg_torch(**kw)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = {n: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for n, t in kw.items()}
        got = chunk_bwd_dqkwg_torch(**fake)
    for name, a, b in zip(NAMES, got, real, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, name
