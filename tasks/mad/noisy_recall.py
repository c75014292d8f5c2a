"""MAD noisy in-context recall: in-context recall with a noise vocabulary on top of the keys and values.

The ``V - noise_vocab_size`` content ids split into keys (lower half) and values (upper half); the noise ids
are ``V - noise_vocab_size..V-1``. Each pair slot before the probe, except one protected slot per row, becomes
two noise tokens (uniform over the noise ids) with probability ``frac_noise``. Noise is never a key: it is
not scored in the test split and the probe never asks about it. Train targets are plain next-token, noise
included, as in mad-lab.

mad-lab draws the protected slot over all ``T/2`` slots, the probe's included, so a row can end up with no key
to probe; here it is drawn over the ``T/2 - 1`` slots before the probe.
"""

from __future__ import annotations

from dataclasses import dataclass

from mixlab.core.fields import NonNegativeInt, PositiveInt
from mixlab.tasks.base import require
from mixlab.tasks.mad.in_context_recall import InContextRecall


class NoisyRecall(InContextRecall):
    name = "mad/noisy_recall"
    description = "MAD in-context recall with pairs replaced by noise tokens that must be ignored."

    @dataclass(frozen=True)
    class Params:
        vocab_size: PositiveInt = 32
        seq_len: PositiveInt = 128
        noise_vocab_size: NonNegativeInt = 16
        frac_noise: float = 0.2

    def _noise(self) -> tuple[int, float]:
        return self.params.noise_vocab_size, self.params.frac_noise

    def validate(self) -> None:
        p = self.params
        require(0.0 <= p.frac_noise < 1.0, f"frac_noise={p.frac_noise} must be in [0, 1)")
        require(
            p.frac_noise == 0 or p.noise_vocab_size > 0,
            f"noise_vocab_size={p.noise_vocab_size} must be > 0 when frac_noise > 0",
        )
        super().validate()
