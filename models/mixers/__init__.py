"""The MIXERS registry: name -> Mixer class, called as factory(config, layer_idx), and the resolution of every
mixer name.

The CLI choices, the parametrised tests and the docs all read this dict, and ModelConfig, the engine and the
leakage probes read what each class declares about itself (``models.layers.Mixer``), so a new built-in mixer is
one module plus one line here.

Wherever a mixer name is accepted (``ModelConfig.mixer``, ``mixlab run --mixer``, sweeps,
``mixlab mad run --model``, ``mixlab leakage``, ``mixlab check-mixer``), ``resolve_mixer`` also takes
- the name of an entry point of the group ``mixlab.mixers`` in an installed package, and
- an import path ``package.module:Factory``,
both external factories ``Factory(d_model, **extras)`` (contract in ``models.mixers.external``). A built-in
name wins over an entry point of the same name.

A hybrid stack names one mixer per layer: ``ModelConfig.mixer`` may be a comma list such as
``"static_conv,attention"``, cycled over the layers (layer i takes entry i mod the list's length, so
``"a,b"`` on 4 layers is a, b, a, b; a list longer than n_layers is refused). ``layer_mixers`` spells it out.
"""

from collections.abc import Callable

from mixlab.core import plugins
from mixlab.core.plugins import is_import_path
from mixlab.models.layers import Mixer
from mixlab.models.mixers.attention import Attention
from mixlab.models.mixers.external import (
    ENTRY_POINT_GROUP,
    ExternalFactory,
    ExternalMixer,
    accepts_cu_seqlens,
    claims_document_blindness,
    entry_points,
    load_target,
)
from mixlab.models.mixers.fla import Based, GatedDeltaNet, GatedLinearAttention, Mamba2, Retention
from mixlab.models.mixers.hyena import Hyena, HyenaLeaky
from mixlab.models.mixers.identity import IdentityMixer
from mixlab.models.mixers.long_conv import GatedLongConv, LeakyFFTConv
from mixlab.models.mixers.short_conv import DynamicConvMixer, HeadwiseDynamicConvMixer, StaticConvMixer

MIXERS: dict[str, type[Mixer]] = {
    "attention": Attention,
    "static_conv": StaticConvMixer,
    "dynamic_conv": DynamicConvMixer,
    "dynamic_conv_headwise": HeadwiseDynamicConvMixer,
    "rubiconv": GatedLongConv,
    "fft_conv_leaky": LeakyFFTConv,
    "hyena": Hyena,
    "hyena_leaky": HyenaLeaky,
    "none": IdentityMixer,
    # baselines on fla-core's ops (optional extra `mixlab[baselines]`)
    "gla": GatedLinearAttention,
    "gated_delta_net": GatedDeltaNet,
    "retnet": Retention,
    "based": Based,
    "mamba2": Mamba2,
}

BUILT_IN = "built-in"
IMPORT_PATH = "import path"
PATTERN_SEP = ","


def mixer_origins() -> dict[str, str]:
    """Every mixer reachable by name and where it comes from: the built-ins (``"built-in"``), then installed
    entry points by name (``"entry point of DIST VERSION (module:Factory)"``). Nothing is imported."""
    return plugins.origins(MIXERS, entry_points(), BUILT_IN)


def resolve_mixer(name: str) -> Callable[..., Mixer]:
    """The factory ``(config, layer_idx) -> Mixer`` of a built-in name, an entry-point name or an import path
    ``package.module:Factory`` (an ``ExternalFactory`` for the last two, which imports the plugin).

    ValueError, one line naming the mixer: an unknown name, two packages registering one name, a malformed
    path, a module that fails to import, a missing attribute, or a target that is not callable.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a mixer is a non-empty name or import path, got {name!r}")
    if name in MIXERS:
        return MIXERS[name]
    if is_import_path(name):
        return ExternalFactory(name, IMPORT_PATH, load_target(name, repr(name)))
    ep, origin = plugins.named_entry_point("mixer", name, entry_points(), mixer_origins(), "package.module:Factory")
    return ExternalFactory(name, origin, load_target(ep.value, f"{name!r} ({origin})"))


def mixer_pattern(mixer: str) -> list[str]:
    """The entries of a per-layer pattern ``"a,b"`` -> ["a", "b"]; one name -> [name]. ValueError, naming the
    pattern, for an empty entry."""
    if not isinstance(mixer, str) or not mixer:
        raise ValueError(f"a mixer is a non-empty name or import path, got {mixer!r}")
    names = [name.strip() for name in mixer.split(PATTERN_SEP)]
    if not all(names):
        raise ValueError(f"mixer pattern {mixer!r} has an empty entry")
    return names


def layer_mixers(mixer: str, n_layers: int) -> list[str]:
    """The mixer name of each of ``n_layers`` layers: the pattern ``mixer`` cycled (module docstring).
    ValueError for a pattern longer than n_layers."""
    names = mixer_pattern(mixer)
    if len(names) > n_layers:
        raise ValueError(f"mixer pattern {mixer!r} names {len(names)} layers, more than n_layers={n_layers}")
    return [names[i % len(names)] for i in range(n_layers)]


def pattern_classes(mixer: str) -> dict[str, type[Mixer]]:
    """Every distinct entry of the pattern ``mixer``, in order, with its ``mixer_class`` (resolving it)."""
    return {name: mixer_class(name) for name in mixer_pattern(mixer)}


def mixer_class(name: str) -> type[Mixer]:
    """The class whose attributes declare what mixer ``name`` is (``models.layers.Mixer``): a built-in's own,
    ``ExternalMixer`` for a plugin or import path. Resolves the name: ValueError as ``resolve_mixer``."""
    factory = resolve_mixer(name)
    return factory if name in MIXERS else ExternalMixer


__all__ = [
    "ENTRY_POINT_GROUP",
    "MIXERS",
    "ExternalFactory",
    "ExternalMixer",
    "accepts_cu_seqlens",
    "claims_document_blindness",
    "layer_mixers",
    "mixer_class",
    "mixer_origins",
    "mixer_pattern",
    "pattern_classes",
    "resolve_mixer",
]
