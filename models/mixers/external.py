"""Mixers written outside mixlab: import paths, installed plugins (entry points) and the adapter into a Block.

The external contract (README, "Bring your own mixer"):

    Factory(d_model, **extras) -> torch.nn.Module
    module(x [B, T, D]) -> [B, T, D]    or    module(x [B, T, D], cu_seqlens=None) -> [B, T, D]

- The factory is any callable, usually the module's class. It gets the model width D as its first positional
  argument (as ``d_model=`` when it has a parameter of that name). Extras: each of its parameters named
  ``layer_idx``, ``config`` (the whole ``ModelConfig``) or after a ModelConfig field (``n_heads``,
  ``max_seq_len``, ``conv_width``, ...) receives that value; every other parameter keeps its default.
- Documents: a forward with a parameter named ``cu_seqlens`` gets the packed layout (int32 [n_docs + 1],
  offsets into the flattened B*T axis, None for one document per row) and so claims exact blindness to the
  other documents of its row, unless the module (class or instance) sets ``leaks_across_documents = True``.
  A forward without that parameter never sees packed inputs: ``ExternalMixer`` refuses them (ValueError), so
  packed tasks fail at the first batch with a message naming the mixer.
- Causality: outputs before t must not depend on inputs at t or later, bitwise unless the module sets
  ``bitwise_causal = False`` (FFT arithmetic: causal up to rounding).

Inside a model every ``nn.Linear`` and ``nn.Embedding`` weight is re-initialised as for the built-in mixers
(``config.init``, ``models.lm.init_weights``); other parameters keep the module's own init.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from collections.abc import Callable
from typing import Any

import torch
from mixlab.core import plugins
from mixlab.core.plugins import error_line, load_object
from mixlab.models.layers import Mixer, MixerConfig
from torch import nn

ENTRY_POINT_GROUP = "mixlab.mixers"
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def load_target(path: str, label: str) -> Callable[..., Any]:
    """The factory at ``package.module:Factory`` (``core.plugins.load_object``); ValueError starting with
    ``mixer {label}`` when it cannot be loaded or is not callable."""
    target = load_object(path, f"mixer {label}", "package.module:Factory")
    if not callable(target):
        raise ValueError(f"mixer {label}: {path} is a {type(target).__name__}, not a callable factory")
    return target


def entry_points() -> dict[str, list[importlib.metadata.EntryPoint]]:
    """Installed entry points of the group ``mixlab.mixers`` by name (nothing is imported)."""
    return plugins.entry_points(ENTRY_POINT_GROUP)


def accepts_cu_seqlens(module: nn.Module) -> bool:
    """True when ``module.forward`` has a parameter named ``cu_seqlens`` (``**kwargs`` does not count)."""
    if isinstance(module, ExternalMixer):
        return module.accepts_documents
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False
    return "cu_seqlens" in params and params["cu_seqlens"].kind in _NAMED


def claims_document_blindness(module: nn.Module) -> bool:
    """True when ``module`` takes ``cu_seqlens`` and does not declare ``leaks_across_documents = True``."""
    return accepts_cu_seqlens(module) and not getattr(module, "leaks_across_documents", False)


class ExternalFactory:
    """A registry-style factory ``(config, layer_idx) -> ExternalMixer`` around an external ``target``
    (module docstring). ``build`` returns the target's module itself, unwrapped."""

    def __init__(self, name: str, origin: str, target: Callable[..., Any]) -> None:
        self.name = name
        self.origin = origin
        self.target = target
        self.__doc__ = target.__doc__

    def arguments(self, config: MixerConfig, layer_idx: int) -> tuple[tuple, dict[str, Any]]:
        """(args, kwargs) of the call: d_model first, then the extras the target's signature names."""
        try:
            params = list(inspect.signature(self.target).parameters.values())
        except (TypeError, ValueError):
            params = []  # a builtin or C callable without a signature: d_model alone
        values = {**config.to_dict(), "config": config, "layer_idx": layer_idx}
        kwargs = {p.name: values[p.name] for p in params if p.kind in _NAMED and p.name in values}
        if "d_model" in kwargs:
            return (), kwargs
        positional = [p for p in params if p.kind in _POSITIONAL]
        if positional:
            kwargs.pop(positional[0].name, None)  # the first positional parameter receives d_model
        return (config.d_model,), kwargs

    def build(self, config: MixerConfig, layer_idx: int = 0) -> nn.Module:
        """The target's module for ``config``; ValueError naming the mixer when the call raises or returns
        something other than an ``nn.Module``."""
        args, kwargs = self.arguments(config, layer_idx)
        shown = [repr(a) for a in args]
        shown += [f"{k}={'...' if k == 'config' else repr(v)}" for k, v in kwargs.items()]
        call = f"{getattr(self.target, '__qualname__', repr(self.target))}({', '.join(shown)})"
        try:
            module = self.target(*args, **kwargs)
        except Exception as exc:
            raise ValueError(f"mixer {self.name!r}: {call} raised {error_line(exc)}") from exc
        if not isinstance(module, nn.Module):
            raise ValueError(f"mixer {self.name!r}: {call} returned a {type(module).__name__}, "
                             "not a torch.nn.Module")
        return module

    def __call__(self, config: MixerConfig, layer_idx: int) -> ExternalMixer:
        return ExternalMixer(self.build(config, layer_idx), self.name)

    def __repr__(self) -> str:
        return f"ExternalFactory({self.name!r}, {self.origin!r})"


class ExternalMixer(Mixer):
    """An external module as a Block's mixer: hands ``cu_seqlens`` only to a forward that takes it, refuses
    packed inputs otherwise, checks that the output has the input's shape, and carries the module's
    ``leaks_across_documents`` and ``bitwise_causal`` declarations. Runs of it never stack in
    ``runners.train.engine``: nothing says its forward runs under ``torch.func.vmap``."""

    stacks_on = ()

    def __init__(self, module: nn.Module, name: str) -> None:
        super().__init__()
        self.module = module
        self.mixer_name = name
        self.accepts_documents = accepts_cu_seqlens(module)
        self.leaks_across_documents = bool(getattr(module, "leaks_across_documents", False))
        self.bitwise_causal = bool(getattr(module, "bitwise_causal", True))

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        if self.accepts_documents:
            y = self.module(x, cu_seqlens=cu_seqlens)
        elif cu_seqlens is None:
            y = self.module(x)
        else:
            raise ValueError(f"mixer {self.mixer_name!r} takes no cu_seqlens, so it cannot run packed "
                             "documents (doc_ids); give its forward a cu_seqlens parameter")
        if not isinstance(y, torch.Tensor) or y.shape != x.shape:
            got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            raise ValueError(f"mixer {self.mixer_name!r} returned {got} for an input of shape "
                             f"{tuple(x.shape)}; a mixer maps [B, T, D] to [B, T, D]")
        return y
