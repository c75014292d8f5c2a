"""External mixers for the plugin tests, reached by import path (``byo_mixers:Name``) as a researcher's own
module would be: good ones, and one per way a mixer can break the contract."""

import torch
from torch import nn


class CumulativeMean(nn.Module):
    """Good, but takes no cu_seqlens: the running mean over the row, then a projection."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        count = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[:, None]  # [T, 1]
        return self.proj(x.cumsum(dim=1) / count)


class WithExtras(nn.Module):
    """Records the extras the factory received (ModelConfig fields, layer_idx, the config)."""

    def __init__(self, width: int, n_heads: int = 1, layer_idx: int = -1, config=None,
                 unrelated: str = "kept") -> None:
        super().__init__()
        self.received = {"width": width, "n_heads": n_heads, "layer_idx": layer_idx, "config": config,
                         "unrelated": unrelated}
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        return self.proj(x)


class DeclaredLeaky(nn.Module):
    """Takes cu_seqlens, ignores it and says so: a causal running sum over the whole packed row."""

    leaks_across_documents = True

    def __init__(self, d_model: int) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        return x.cumsum(dim=1)


class LeakyClaimsBlind(DeclaredLeaky):
    """The same running sum, claiming blindness (takes cu_seqlens, declares nothing): must be caught."""

    leaks_across_documents = False


class WrongShape(CumulativeMean):
    """Returns [B, T, 1]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)[..., :1]


class Lookahead(CumulativeMean):
    """Reads the next token: not causal."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.roll(x, shifts=-1, dims=1))


class _NanBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("nan")


class NanGradient(CumulativeMean):
    """Finite outputs, NaN gradients."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(_NanBackward.apply(x))


class Noisy(CumulativeMean):
    """Adds fresh noise every call, from its own generator: not deterministic (nor causal-looking)."""

    def __init__(self, d_model: int) -> None:
        super().__init__(d_model)
        self.generator = torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.rand(x.shape, generator=self.generator).to(device=x.device, dtype=x.dtype)
        return super().forward(x) + noise


class Float32Out(CumulativeMean):
    """Always returns float32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).float()


class RaisesInInit(nn.Module):
    def __init__(self, d_model: int) -> None:
        raise RuntimeError(f"cannot build at d_model={d_model}")


def returns_tensor(d_model: int) -> torch.Tensor:
    return torch.zeros(d_model)


NOT_A_FACTORY = 3
