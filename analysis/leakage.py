"""Leakage probes (docs/leakage.md): is a mixer, or a whole model, exactly blind to the other documents of a row?

Every probe takes a function ``f(x [B, T, D], cu_seqlens) -> [B, T, D_out]`` (a mixer, or a model with its
token embedding replaced by ``x``: ``model_function``), an input ``x`` and a packed layout ``cu_seqlens``
(int32 [n_docs + 1], ``kernels.utils``):

1. perturbation: document j's inputs replaced by fresh normal values; every other document's outputs must be
   ``torch.equal`` to before (for a model also with j's token ids changed).
2. NaN injection: document j's inputs all NaN, then only its last one; every other document's outputs stay
   finite. Catches arithmetic that multiplies another document by zero (a dense 0/1 mask: 0 * NaN = NaN).
3. exact-zero gradient: for each document i, the VJP of a random cotangent on i's outputs is exactly 0 at
   every input position outside i. One ``torch.func.vjp``, its ``vjp_fn`` vmapped over the documents'
   cotangents; a loop over plain autograd instead where torch.func cannot transform an op (a Triton custom
   op); the report says which ran.
4. packing invariance: every document run alone (one row, no cu_seqlens) against its slice of the packed
   output; the largest absolute difference, within ``PACKING_TOL`` in fp32.
5. leakage metric: the cross-document share of Jacobian energy ``sum_{i!=j} |J_ij|^2 / sum_{i,j} |J_ij|^2``,
   J_ij the Jacobian of document i's outputs with respect to document j's inputs. Hutchinson: for a Rademacher
   cotangent v on the outputs of a group of positions inside document i, ``E |(J^T v)_s|^2`` is the energy of
   the group's Jacobian rows at input position s, so one VJP per group and probe gives a whole block row. One
   group per document gives the metric; one group per token gives the leakage against the distance from the
   token's document start (``distance_profile``). Exactly 0 when probe 3 holds.

A mixer claims exact blindness unless its class sets ``leaks_across_documents = True``; a claimant fails when
any of probes 1-4 fails or its metric is above 0. ``probe_mixer`` builds a registered mixer (or a small LM
around it) and runs every probe on a random packed layout; all randomness comes from its ``seed``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from mixlab import kernels, models
from mixlab.core.fields import PositiveInt, check
from mixlab.models.config import QKV_CONVS
from torch import nn

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn
    from matplotlib.figure import Figure

MixerFn = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]

PACKING_TOL = 1e-5  # fp32: a document alone and packed differ by rounding only (FFT sizes, summation order)
BACKENDS = ("auto", *kernels.utils.BACKENDS)
DEVICES = ("cpu", "cuda")
LEVELS = ("mixer", "model")
QKV_PREFIX = "+qkv_"
VOCAB_SIZE = 16  # token ids of the small LM of level "model"
VMAP_CHUNK = 64  # cotangents per vmapped VJP call: bounds memory when every token is a group


# --- layouts


def random_layout(rng: np.random.Generator, rows: int, seq_len: int,
                  max_doc_len: int | None = None) -> torch.Tensor:
    """cu_seqlens (int32 [n_docs + 1]) of ``rows`` packed rows of ``seq_len`` tokens.

    Document lengths are uniform in [1, max_doc_len] (default ``seq_len // 4``, at least 1), drawn from
    ``rng`` until the row is full; the last document of a row takes the remainder. One-token documents and
    documents shorter than a conv's width are common.
    """
    rows, seq_len = check("rows", rows, PositiveInt), check("seq_len", seq_len, PositiveInt)
    max_doc_len = max(1, seq_len // 4) if max_doc_len is None else check("max_doc_len", max_doc_len, PositiveInt)
    if max_doc_len > seq_len:
        raise ValueError(f"max_doc_len must be an integer in [1, seq_len={seq_len}], got {max_doc_len!r}")
    offsets = [0]
    for row in range(rows):
        end = (row + 1) * seq_len
        while offsets[-1] < end:
            offsets.append(min(offsets[-1] + int(rng.integers(1, max_doc_len + 1)), end))
    return torch.tensor(offsets, dtype=torch.int32)


def document_spans(cu_seqlens: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) on the flattened B*T axis of every non-empty document of ``cu_seqlens``."""
    cu = cu_seqlens.detach().cpu().tolist()
    return [(start, end) for start, end in zip(cu[:-1], cu[1:]) if end > start]


def _span_masks(spans: list[tuple[int, int]], n_tokens: int, device: torch.device) -> torch.Tensor:
    """[n_docs, n_tokens] bool: True on the tokens of each document."""
    token = torch.arange(n_tokens, device=device)
    starts = torch.tensor([s for s, _ in spans], device=device)
    ends = torch.tensor([e for _, e in spans], device=device)
    return (token[None, :] >= starts[:, None]) & (token[None, :] < ends[:, None])


def _outside(out: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Rows of ``out`` [B*T, ...] outside the document [start, end)."""
    return torch.cat([out[:start], out[end:]])


def _normal(shape: tuple[int, ...], generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """Standard normal values drawn on the CPU from ``generator`` (the same on every device), on like's."""
    return torch.randn(shape, generator=generator).to(device=like.device, dtype=like.dtype)


def _rademacher(shape: tuple[int, ...], generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    signs = torch.randint(0, 2, shape, generator=generator).to(device=like.device, dtype=like.dtype)
    return 2 * signs - 1


# --- probes


@torch.no_grad()
def perturbation_probe(f: MixerFn, x: torch.Tensor, cu_seqlens: torch.Tensor, *,
                       generator: torch.Generator) -> bool:
    """Probe 1: True when replacing any one document's inputs by fresh normal values leaves every other
    document's outputs bitwise equal."""
    B, T, D = x.shape
    before = f(x, cu_seqlens).reshape(B * T, -1)
    for start, end in document_spans(cu_seqlens):
        changed = x.reshape(B * T, D).clone()
        changed[start:end] = _normal((end - start, D), generator, x)
        after = f(changed.view(B, T, D), cu_seqlens).reshape(B * T, -1)
        if not torch.equal(_outside(after, start, end), _outside(before, start, end)):
            return False
    return True


@torch.no_grad()
def nan_probe(f: MixerFn, x: torch.Tensor, cu_seqlens: torch.Tensor) -> bool:
    """Probe 2: True when NaN in any one document's inputs (all of them, or its last token only) leaves every
    other document's outputs finite."""
    B, T, D = x.shape
    for start, end in document_spans(cu_seqlens):
        for first in (start, end - 1):
            poisoned = x.reshape(B * T, D).clone()
            poisoned[first:end] = float("nan")
            out = f(poisoned.view(B, T, D), cu_seqlens).reshape(B * T, -1)
            if not torch.isfinite(_outside(out, start, end)).all():
                return False
    return True


def _batched_vjp(f: MixerFn, x: torch.Tensor, cu_seqlens: torch.Tensor | None,
                 make_cotangents: Callable[[torch.Tensor], torch.Tensor],
                 generator: torch.Generator) -> tuple[torch.Tensor, str]:
    """Input gradients [N, B*T, D] of f at x for the N cotangents ``make_cotangents(y)`` ([N, *y.shape],
    drawn from ``generator``) and how they were computed: "vmap" over one torch.func vjp_fn, or "loop" over
    plain autograd where torch.func cannot transform an op of f (a Triton custom op). Both draw the same
    cotangents."""
    B, T, D = x.shape
    state = generator.get_state()
    try:
        y, vjp_fn = torch.func.vjp(lambda inp: f(inp, cu_seqlens), x)
        cotangents = make_cotangents(y)
        with warnings.catch_warnings():
            # ops without a batching rule (SDPA's backward on the CPU) run a per-sample fallback: slow, exact
            warnings.filterwarnings("ignore", message=".*batching rule.*")
            (grads,) = torch.func.vmap(vjp_fn, chunk_size=VMAP_CHUNK)(cotangents)
        return grads.detach().reshape(len(cotangents), B * T, D), "vmap"
    except (RuntimeError, NotImplementedError):
        generator.set_state(state)  # a genuine error of f raises again below, outside torch.func
    leaf = x.detach().requires_grad_()
    with torch.enable_grad():
        y = f(leaf, cu_seqlens)
    cotangents = make_cotangents(y.detach())
    grads = []
    for ct in cotangents:
        (grad,) = torch.autograd.grad(y, leaf, ct, retain_graph=True, allow_unused=True)
        grads.append(torch.zeros_like(leaf) if grad is None else grad)
    return torch.stack(grads).reshape(len(cotangents), B * T, D), "loop"


def gradient_probe(f: MixerFn, x: torch.Tensor, cu_seqlens: torch.Tensor, *,
                   generator: torch.Generator) -> tuple[bool, str]:
    """Probe 3: (True when, for every document i, the gradient of a random normal projection of i's outputs
    is exactly 0 at every input position outside i; "vmap" or "loop", as ``_batched_vjp`` ran)."""
    B, T, _ = x.shape
    masks = _span_masks(document_spans(cu_seqlens), B * T, x.device)  # [n_docs, B*T]

    def cotangents(y: torch.Tensor) -> torch.Tensor:
        ct = _normal((len(masks), B * T, y.shape[-1]), generator, y)  # [n_docs, B*T, D_out]
        return (ct * masks[..., None]).view(len(masks), *y.shape)

    grads, method = _batched_vjp(f, x, cu_seqlens, cotangents, generator)  # [n_docs, B*T, D]
    return bool((grads[~masks] == 0).all()), method


def _group_energies(f: MixerFn, x: torch.Tensor, cu_seqlens: torch.Tensor, groups: torch.Tensor,
                    owners: torch.Tensor, generator: torch.Generator,
                    n_probes: int) -> tuple[np.ndarray, np.ndarray]:
    """Hutchinson estimates of the (cross, total) Jacobian energy [G] of each group of output positions.

    groups [G, B*T] bool: a group's output positions (inside one document); owners [G, B*T] bool: that
    document's input positions. cross sums the input positions outside the owner, total all of them.
    """
    B, T, _ = x.shape
    G = len(groups)

    def cotangents(y: torch.Tensor) -> torch.Tensor:
        v = _rademacher((n_probes, G, B * T, y.shape[-1]), generator, y) * groups[..., None]
        return v.view(n_probes * G, *y.shape)

    grads, _ = _batched_vjp(f, x, cu_seqlens, cotangents, generator)  # [P*G, B*T, D]
    energy = grads.double().pow(2).sum(-1).view(n_probes, G, B * T)
    cross = (energy * ~owners).sum(-1).mean(0)  # [G]
    total = energy.sum(-1).mean(0)
    return cross.cpu().numpy(), total.cpu().numpy()


def leakage_metric(f: MixerFn, x: torch.Tensor, cu_seqlens: torch.Tensor, *, generator: torch.Generator,
                   n_probes: int = 4) -> float:
    """Probe 5: cross-document share of Jacobian energy, Hutchinson with ``n_probes`` Rademacher probes per
    document (module docstring); exactly 0 where every cross-document gradient is exactly 0."""
    B, T, _ = x.shape
    masks = _span_masks(document_spans(cu_seqlens), B * T, x.device)
    cross, total = _group_energies(f, x, cu_seqlens, masks, masks, generator, n_probes)
    return float(cross.sum() / total.sum()) if total.sum() > 0 else 0.0


@torch.no_grad()
def packing_probe(f: MixerFn, x: torch.Tensor, cu_seqlens: torch.Tensor) -> float:
    """Probe 4: largest absolute difference between any document run alone (one row, no cu_seqlens) and its
    slice of the packed output; inf when either is not finite."""
    B, T, D = x.shape
    packed = f(x, cu_seqlens).reshape(B * T, -1)
    flat = x.reshape(B * T, D)
    worst = 0.0
    for start, end in document_spans(cu_seqlens):
        alone = f(flat[start:end][None], None)[0]  # [L, D_out]
        diff = (alone - packed[start:end]).abs()
        if not torch.isfinite(diff).all():
            return math.inf
        worst = max(worst, diff.max().item())
    return worst


@dataclasses.dataclass(frozen=True, eq=False)
class DistanceProfile:
    """Cross-document share of Jacobian energy of the outputs at each distance (tokens) from their document's
    start: ``share[k] = cross[k] / total[k]``, summed over every output token at ``distance[k]``."""

    distance: np.ndarray  # [K] int
    share: np.ndarray  # [K]
    cross: np.ndarray  # [K]
    total: np.ndarray  # [K]


def distance_profile(f: MixerFn, x: torch.Tensor, cu_seqlens: torch.Tensor, *, generator: torch.Generator,
                     n_probes: int = 2) -> DistanceProfile:
    """Probe 5 token by token (one Hutchinson group per output token), bucketed by the distance from the
    token to its document's start, the boundary a causal leak crosses."""
    B, T, _ = x.shape
    spans = document_spans(cu_seqlens)
    docs = _span_masks(spans, B * T, x.device)  # [n_docs, B*T]
    doc_of = docs.float().argmax(0)  # [B*T]: the document of each token
    groups = torch.eye(B * T, dtype=torch.bool, device=x.device)  # one output token per group
    cross, total = _group_energies(f, x, cu_seqlens, groups, docs[doc_of], generator, n_probes)
    starts = torch.tensor([s for s, _ in spans])
    distance = (torch.arange(B * T) - starts[doc_of.cpu()]).numpy()
    cross_k = np.bincount(distance, weights=cross)
    total_k = np.bincount(distance, weights=total)
    share = np.divide(cross_k, total_k, out=np.zeros_like(cross_k), where=total_k > 0)
    return DistanceProfile(distance=np.arange(len(share)), share=share, cross=cross_k, total=total_k)


# --- report


@dataclasses.dataclass(frozen=True)
class LeakageReport:
    """Every probe's outcome for one mixer (or model). The booleans are True when the probe finds no leak."""

    name: str
    claims_blind: bool  # its class does not set leaks_across_documents
    perturbation: bool
    nan: bool
    gradient: bool
    packing_max_diff: float
    leakage: float
    n_docs: int
    gradient_method: str  # "vmap" or "loop"
    level: str = "mixer"
    packing_tol: float = PACKING_TOL

    @property
    def packing(self) -> bool:
        return self.packing_max_diff <= self.packing_tol

    @property
    def failed_probes(self) -> list[str]:
        """The probes that found a leak (packing: a difference above the tolerance; metric: above 0)."""
        outcomes = {"perturbation": self.perturbation, "nan": self.nan, "gradient": self.gradient,
                    "packing": self.packing, "metric": not self.leakage > 0}
        return [name for name, passed in outcomes.items() if not passed]

    @property
    def failed(self) -> bool:
        """A mixer that claims exact blindness failed a probe."""
        return self.claims_blind and bool(self.failed_probes)

    @property
    def verdict(self) -> str:
        if not self.failed_probes:
            return "exact" if self.claims_blind else "no leak found (declared leaky)"
        if self.claims_blind:
            return "FAIL: " + ", ".join(self.failed_probes)
        return "leaks (declared)"

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "packing": self.packing, "failed": self.failed,
                "verdict": self.verdict}


def probe_function(f: MixerFn, x: torch.Tensor, cu_seqlens: torch.Tensor, *, name: str, claims_blind: bool,
                   generator: torch.Generator, n_probes: int = 4, level: str = "mixer",
                   packing_tol: float = PACKING_TOL) -> LeakageReport:
    """Probes 1-5 on ``f`` at ``x`` [B, T, D] with layout ``cu_seqlens``; random draws from ``generator``."""
    if x.dim() != 3:
        raise ValueError(f"x must be [B, T, D], got shape {tuple(x.shape)}")
    kernels.utils.validate_cu_seqlens(cu_seqlens, x.shape[0], x.shape[1])
    n_probes = check("n_probes", n_probes, PositiveInt)
    cu_seqlens = cu_seqlens.to(x.device)
    gradient, method = gradient_probe(f, x, cu_seqlens, generator=generator)
    return LeakageReport(
        name=name,
        claims_blind=claims_blind,
        perturbation=perturbation_probe(f, x, cu_seqlens, generator=generator),
        nan=nan_probe(f, x, cu_seqlens),
        gradient=gradient,
        packing_max_diff=packing_probe(f, x, cu_seqlens),
        leakage=leakage_metric(f, x, cu_seqlens, generator=generator, n_probes=n_probes),
        n_docs=len(document_spans(cu_seqlens)),
        gradient_method=method,
        level=level,
        packing_tol=packing_tol,
    )


# --- whole models


def model_function(model: nn.Module) -> MixerFn:
    """``f(x [B, T, D], cu_seqlens) -> logits [B, T, V]``: ``model`` (a ``models`` LM or compression model)
    with the output of its token embedding replaced by ``x`` and cu_seqlens turned into doc_ids."""

    def f(x: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
        B, T, _ = x.shape
        doc_ids = None if cu_seqlens is None else kernels.utils.cu_seqlens_to_doc_ids(cu_seqlens, B, T)
        handle = model.embed.register_forward_hook(lambda module, args, output: x)
        try:
            return model(torch.zeros(B, T, dtype=torch.long, device=x.device), doc_ids=doc_ids)
        finally:
            handle.remove()

    return f


@torch.no_grad()
def token_perturbation_probe(model: nn.Module, input_ids: torch.Tensor, doc_ids: torch.Tensor, *,
                             generator: torch.Generator) -> bool:
    """Probe 1 on token ids: True when changing every token of any one document leaves every other document's
    logits bitwise equal."""
    B, T = input_ids.shape
    vocab = model.embed.num_embeddings
    before = model(input_ids, doc_ids=doc_ids).reshape(B * T, -1)
    for start, end in document_spans(kernels.utils.doc_ids_to_cu_seqlens(doc_ids)):
        changed = input_ids.reshape(B * T).clone()
        shift = torch.randint(1, max(vocab, 2), (end - start,), generator=generator).to(input_ids.device)
        changed[start:end] = (changed[start:end] + shift) % vocab  # every token of the document changes
        after = model(changed.view(B, T), doc_ids=doc_ids).reshape(B * T, -1)
        if not torch.equal(_outside(after, start, end), _outside(before, start, end)):
            return False
    return True


def probe_model(model: nn.Module, input_ids: torch.Tensor, doc_ids: torch.Tensor, *, name: str,
                generator: torch.Generator, n_probes: int = 4) -> LeakageReport:
    """Probes 1-5 on a whole model at the embeddings of ``input_ids`` [B, T], documents ``doc_ids`` [B, T];
    probe 1 also changes token ids. The model claims blindness unless one of its modules declares a leak."""
    if input_ids.dim() != 2 or doc_ids.shape != input_ids.shape:
        raise ValueError(f"input_ids and doc_ids must be [B, T] of one shape, got {tuple(input_ids.shape)} "
                         f"and {tuple(doc_ids.shape)}")
    claims_blind = not any(getattr(m, "leaks_across_documents", False) for m in model.modules())
    with torch.no_grad():
        x = model.embed(input_ids)  # [B, T, D]
    cu_seqlens = kernels.utils.doc_ids_to_cu_seqlens(doc_ids)
    report = probe_function(model_function(model), x, cu_seqlens, name=name, claims_blind=claims_blind,
                            generator=generator, n_probes=n_probes, level="model")
    tokens_blind = token_perturbation_probe(model, input_ids, doc_ids, generator=generator)
    return dataclasses.replace(report, perturbation=report.perturbation and tokens_blind)


# --- registered mixers


def mixer_names() -> list[str]:
    """The rows of ``--mixer all``: every registered mixer whose dependencies are installed (``available``), then
    each one that takes a qkv conv (attention) with each qkv conv."""
    with_qkv = [name for name, cls in models.MIXERS.items() if cls.takes_qkv_conv]
    available = [name for name, cls in models.MIXERS.items() if cls.available()]
    return available + [f"{name}{QKV_PREFIX}{q}" for name in with_qkv for q in QKV_CONVS if q != "none"]


def parse_mixer_name(name: str) -> tuple[str, str]:
    """``"attention+qkv_static"`` -> ("attention", "static"); ``"rubiconv"`` -> ("rubiconv", "none"); an
    installed plugin's name or an import path ``package.module:Factory`` -> (name, "none")."""
    if name in mixer_names():
        mixer, _, qkv = name.partition(QKV_PREFIX)
        return mixer, qkv or "none"
    if isinstance(name, str) and (":" in name or name in models.mixer_origins()):
        models.resolve_mixer(name)  # imports the plugin: a broken one fails here, naming itself
        return name, "none"
    raise ValueError(f"unknown mixer {name!r}; choose from {', '.join(mixer_names())}, an installed plugin, "
                     "an import path package.module:Factory, or all")


def resolve_names(mixer: str | Sequence[str]) -> list[str]:
    """``"all"`` -> ``mixer_names()``; a name or a list of names -> the checked list."""
    names = mixer_names() if mixer == "all" else [mixer] if isinstance(mixer, str) else list(mixer)
    for name in names:
        parse_mixer_name(name)
    return names


def pick_device(device: str | torch.device) -> torch.device:
    try:
        device = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {device!r}; choose from {', '.join(DEVICES)}") from exc
    check("device", device.type, Literal[DEVICES])
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device")
    return device


def use_backend(module: nn.Module, backend: str) -> None:
    """Set the kernel backend of every module inside ``module`` that calls a kernel op (its class names the op
    in ``kernel_op``, ``models.layers.Mixer``): None for "auto", "torch", or for "triton" "triton" where the op
    has a Triton kernel and "torch" where it has none yet (not in ``kernels.utils.TRITON_OPS``), the fallback
    ``resolve_backend`` applies under auto."""
    check("backend", backend, Literal[BACKENDS])
    for sub in module.modules():
        op = getattr(sub, "kernel_op", None)
        if op is None:
            continue
        if backend == "triton":
            sub.backend = "triton" if op in kernels.utils.TRITON_OPS else "torch"
        else:
            sub.backend = None if backend == "auto" else backend


def build_probe_module(name: str, *, level: str = "mixer", backend: str = "auto", d_model: int = 32,
                       seq_len: int = 64, seed: int = 0) -> nn.Module:
    """The mixer ``name`` (level "mixer") or a 2-block LM around it (level "model"), width ``d_model`` (a
    multiple of 8: 4 attention heads of even size), initialised from ``seed`` without touching the caller's
    global RNG; on the CPU, in eval mode."""
    check("level", level, Literal[LEVELS])
    mixer, qkv = parse_mixer_name(name)
    config = models.ModelConfig(vocab_size=VOCAB_SIZE, d_model=d_model, n_layers=2, mixer=mixer, n_heads=4,
                                mlp_hidden=2 * d_model, max_seq_len=seq_len, qkv_conv=qkv)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = models.build_model(config) if level == "model" else models.resolve_mixer(mixer)(config, 0)
    use_backend(module, backend)
    return module.eval()


@dataclasses.dataclass
class _Setup:
    """What every probe of ``probe_mixer`` / ``leakage_by_distance`` runs on."""

    name: str
    module: nn.Module
    f: MixerFn
    x: torch.Tensor  # [B, T, D]
    cu_seqlens: torch.Tensor
    generator: torch.Generator
    input_ids: torch.Tensor | None  # [B, T], level "model" only


def _setup(mixer: str | nn.Module, *, level: str, backend: str, device: str | torch.device, rows: int,
           seq_len: int, d_model: int, max_doc_len: int | None, seed: int) -> _Setup:
    check("level", level, Literal[LEVELS])
    device = pick_device(device)
    if isinstance(mixer, str):
        name = mixer
        module = build_probe_module(mixer, level=level, backend=backend, d_model=d_model, seq_len=seq_len,
                                    seed=seed)
    elif isinstance(mixer, nn.Module):
        check("backend", backend, Literal[BACKENDS])
        name, module = type(mixer).__name__, mixer.eval()
    else:
        raise ValueError(f"mixer must be a name or an nn.Module, got {type(mixer).__name__}")
    module = module.to(device)
    cu_seqlens = random_layout(np.random.default_rng(seed), rows, seq_len, max_doc_len).to(device)
    generator = torch.Generator().manual_seed(seed)
    if level == "model":
        input_ids = torch.randint(0, module.embed.num_embeddings, (rows, seq_len), generator=generator)
        input_ids = input_ids.to(device)
        with torch.no_grad():
            x = module.embed(input_ids)  # [B, T, D]
        return _Setup(name, module, model_function(module), x, cu_seqlens, generator, input_ids)
    x = torch.randn(rows, seq_len, d_model, generator=generator).to(device)

    def f(inp: torch.Tensor, cu: torch.Tensor | None) -> torch.Tensor:
        return module(inp, cu_seqlens=cu)

    return _Setup(name, module, f, x, cu_seqlens, generator, None)


def probe_mixer(mixer: str | nn.Module, *, level: str = "mixer", backend: str = "auto",
                device: str | torch.device = "cpu", rows: int = 4, seq_len: int = 64, d_model: int = 32,
                max_doc_len: int | None = None, n_probes: int = 4, seed: int = 0) -> LeakageReport:
    """Every probe on a registered mixer (a name of ``mixer_names()``) or on a module (a Mixer for level
    "mixer", a ``models`` LM for level "model"), at ``rows`` random packed rows of ``seq_len`` tokens.

    The layout (``random_layout``), inputs and probes come from ``seed``; a named mixer is also initialised
    from it and runs on ``backend``, while a module keeps its own backend settings (it is moved to ``device``
    and put in eval mode).
    """
    s = _setup(mixer, level=level, backend=backend, device=device, rows=rows, seq_len=seq_len,
               d_model=d_model, max_doc_len=max_doc_len, seed=seed)
    if level == "model":
        doc_ids = kernels.utils.cu_seqlens_to_doc_ids(s.cu_seqlens, rows, seq_len)
        return probe_model(s.module, s.input_ids, doc_ids, name=s.name, generator=s.generator,
                           n_probes=n_probes)
    return probe_function(s.f, s.x, s.cu_seqlens, name=s.name, generator=s.generator, n_probes=n_probes,
                          claims_blind=not getattr(s.module, "leaks_across_documents", False))


def probe_all(mixers: str | Sequence[str] = "all", **settings) -> list[LeakageReport]:
    """``probe_mixer`` for each name of ``mixers`` ("all", one name, or a list), with the same settings."""
    return [probe_mixer(name, **settings) for name in resolve_names(mixers)]


def leakage_by_distance(mixer: str | nn.Module, *, level: str = "mixer", backend: str = "auto",
                        device: str | torch.device = "cpu", rows: int = 4, seq_len: int = 64,
                        d_model: int = 32, max_doc_len: int | None = None, n_probes: int = 2,
                        seed: int = 0) -> DistanceProfile:
    """``distance_profile`` of a registered mixer or a module, set up as in ``probe_mixer``."""
    s = _setup(mixer, level=level, backend=backend, device=device, rows=rows, seq_len=seq_len,
               d_model=d_model, max_doc_len=max_doc_len, seed=seed)
    return distance_profile(s.f, s.x, s.cu_seqlens, generator=s.generator, n_probes=n_probes)


# --- table and plot


def format_table(reports: Sequence[LeakageReport]) -> str:
    """One row per report: claim, probe verdicts, packing max |diff|, leakage metric, documents, verdict."""
    header = ("mixer", "claims", "perturb", "nan", "grad", "pack max|diff|", "leakage", "docs", "verdict")
    rows = [header]
    for r in reports:
        rows.append((
            r.name, "blind" if r.claims_blind else "leaky",
            *("ok" if passed else "LEAK" for passed in (r.perturbation, r.nan, r.gradient)),
            f"{r.packing_max_diff:.1e}" + ("" if r.packing else " !"),
            "0" if r.leakage == 0 else f"{r.leakage:.2e}", str(r.n_docs), r.verdict,
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1]
                     for row in rows)


def plot_leakage_by_distance(profiles: Mapping[str, DistanceProfile], path: str | Path) -> Path:
    """``leakage_figure`` written to ``path``; the file type follows its suffix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    leakage_figure(profiles).savefig(path)
    return path


def leakage_figure(profiles: Mapping[str, DistanceProfile]) -> Figure:
    """Each profile's cross-document share against the distance from the document start. The mixers that leak
    are lines above (symlog y), each in its own colour and marker of a categorical palette; those whose share is
    0 at every distance, which would lie on one another at 0, are a row each below, named on the axis."""
    # imported here: seaborn and matplotlib take about a second to import and only the plot needs them
    import seaborn as sns
    from matplotlib.figure import Figure

    leaky = [name for name, profile in profiles.items() if (profile.share > 0).any()]
    exact = [name for name in profiles if name not in leaky]
    fig = Figure(figsize=(9, 3.2 + 0.22 * len(exact)))  # no pyplot: no global figure state, no GUI backend
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3.2, 0.3 + 0.22 * max(len(exact), 1)])
    colours = sns.color_palette("tab10" if len(leaky) <= 10 else "husl", max(len(leaky), 1))
    for i, name in enumerate(leaky):
        profile = profiles[name]
        top.plot(profile.distance, profile.share, color=colours[i], marker="os^Dv<>pP*"[i % 10], markersize=4,
                 label=name)
    top.set_yscale("symlog", linthresh=1e-6)
    top.set_ylim(bottom=0)
    top.set_ylabel("cross-document share\nof Jacobian energy")
    top.set_title("Leakage against distance from the boundary")
    if leaky:
        top.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, title="leaks")
    else:
        top.text(0.5, 0.5, "no mixer leaks", transform=top.transAxes, ha="center", va="center")
    for i, name in enumerate(exact):
        distance = profiles[name].distance
        bottom.plot(distance, np.full(len(distance), i), color="0.45", marker="o", markersize=2.5, linewidth=0.8)
    bottom.set_yticks(range(len(exact)), exact, fontsize="small")
    bottom.set_ylim(-0.7, max(len(exact), 1) - 0.3)
    bottom.invert_yaxis()
    bottom.set_title("share 0 at every distance (exact)", fontsize="medium")
    bottom.set_xlabel("distance from document start (tokens)")
    fig.tight_layout()
    return fig
