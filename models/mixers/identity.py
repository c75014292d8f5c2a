"""The `none` mixer: identity, no token mixing (MLP-only baseline).

The block still adds its output, so a block computes x + norm(x) then the MLP: a per-token map only.
"""

from __future__ import annotations

import torch
from mixlab.models.layers import Mixer, MixerConfig


class IdentityMixer(Mixer):
    """Returns its input unchanged; has no parameters."""

    def __init__(self, config: MixerConfig, layer_idx: int) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        return x
