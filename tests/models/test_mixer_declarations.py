"""What each mixer declares on its class (``models.layers.Mixer``) and the code that reads it: ModelConfig's
checks, the leakage probes' per-op backends and rows, the engine's stacking (tests/runners/test_engine.py). A
new mixer is its class plus one registry line."""

import pytest
import torch
from mixlab import kernels, models
from mixlab.analysis import leakage
from mixlab.models import MIXERS, ModelConfig
from mixlab.models.config import KERNEL_BACKENDS, QKV_CONVS
from mixlab.models.layers import Mixer
from mixlab.models.mixers import ExternalMixer, fla_ops

CASES = [(name, "none") for name in MIXERS] + [("attention", q) for q in QKV_CONVS if q != "none"]


def test_every_registry_entry_is_a_mixer_class_that_declares_itself():
    for name, cls in MIXERS.items():
        assert isinstance(cls, type) and issubclass(cls, Mixer), name
        assert models.mixer_class(name) is cls
        assert set(cls.stacks_on) <= set(KERNEL_BACKENDS), name
    assert MIXERS["rubiconv"].stacks_on == (None, "torch")
    assert [name for name, cls in MIXERS.items() if cls.takes_qkv_conv] == ["attention"]


def test_a_plugin_declares_nothing_before_it_is_built():
    cls = models.mixer_class("torch.nn:Identity")
    assert cls is ExternalMixer and cls.stacks_on == () and not cls.takes_qkv_conv
    with pytest.raises(ValueError, match="no_such_mixer"):
        models.mixer_class("no_such_mixer")


@pytest.mark.parametrize(("mixer", "qkv_conv"), CASES, ids=[f"{m}-{q}" for m, q in CASES])
def test_every_module_with_a_backend_names_its_kernel_op(mixer, qkv_conv):
    config = ModelConfig(vocab_size=11, d_model=16, n_heads=2, max_seq_len=16, mixer=mixer, qkv_conv=qkv_conv,
                         conv_head_size=4)
    module = MIXERS[mixer](config, 0)
    for sub in module.modules():
        assert hasattr(sub, "backend") == hasattr(sub, "kernel_op"), type(sub).__name__
        if hasattr(sub, "kernel_op"):
            assert callable(getattr(kernels, sub.kernel_op, None)) or sub.kernel_op in fla_ops.KERNEL_OPS


class Doubling(Mixer):
    """A new mixer: takes a qkv conv (which it ignores), refuses an odd width, stacks under auto only."""

    takes_qkv_conv = True
    stacks_on = (None,)

    @classmethod
    def check_config(cls, config) -> None:
        if config.d_model % 2:
            raise ValueError(f"ModelConfig.d_model={config.d_model} is odd")

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        return 2 * x


def test_a_new_mixer_is_its_class_and_one_registry_line(monkeypatch):
    monkeypatch.setitem(MIXERS, "doubling", Doubling)
    config = ModelConfig(vocab_size=11, d_model=16, mixer="doubling", qkv_conv="static")
    assert isinstance(models.build_model(config).blocks[0].mixer, Doubling)
    with pytest.raises(ValueError, match="d_model=15 is odd"):
        ModelConfig(vocab_size=11, d_model=15, mixer="doubling")
    with pytest.raises(ValueError, match="needs mixer='attention' or mixer='doubling', got mixer='rubiconv'"):
        ModelConfig(vocab_size=11, mixer="rubiconv", qkv_conv="static")
    assert "doubling+qkv_static" in leakage.mixer_names()
    assert leakage.parse_mixer_name("doubling+qkv_dynamic_lowrank") == ("doubling", "dynamic_lowrank")
