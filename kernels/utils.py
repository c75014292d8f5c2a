"""Shared helpers of the kernels: document layouts (``cu_seqlens`` <-> ``doc_ids``), input checks, backends.

A packed batch ``x: [B, T, D]`` holds documents laid end to end inside each row. ``cu_seqlens`` is an int32
tensor ``[n_docs + 1]`` of offsets into the flattened ``B * T`` token axis: it starts at 0, ends at ``B * T``,
never decreases and contains every row end ``k * T``, so a document never spans two rows. Two equal
consecutive offsets are an empty document. ``doc_ids: [B, T]`` numbers the documents within each row
(0, 1, ...); a new document starts at a row start or wherever the id changes.
"""

import os
import warnings
import weakref

import torch

# Every op's backends: "torch" runs the plain-torch reference (``naive.py`` beside each op), "triton" its Triton
# kernels. None picks one (``resolve_backend``); configs and command lines that need a name for that spell it
# AUTO_BACKEND.
BACKENDS = ("torch", "triton")
AUTO_BACKEND = "auto"
# RubiConv also runs its GEMM form in torch matmuls (``kernels.rubiconv.gemm``).
RUBICONV_BACKENDS = (*BACKENDS, "gemm")
# Ops whose Triton kernel exists: each op.py adds its name where Triton imports.
TRITON_OPS: set[str] = set()
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def env_backend() -> str | None:
    """The backend forced by the env var ``MIXLAB_BACKEND`` (torch|triton), or None when it is unset or empty."""
    env = os.environ.get("MIXLAB_BACKEND", "")
    if env and env not in BACKENDS:
        raise ValueError(f"MIXLAB_BACKEND={env!r} is not a backend; expected {' or '.join(BACKENDS)}")
    return env or None


def resolve_backend(backend: str | None, x: torch.Tensor, op: str | None = None) -> str:
    """Return "torch" or "triton" for an op on input ``x``.

    ``backend=None`` is auto: the env var ``MIXLAB_BACKEND`` (torch|triton) when set, else "triton" when ``x``
    is on CUDA, else "torch". When ``op`` is given and has no Triton kernel in ``TRITON_OPS``, auto falls back
    to "torch"; an explicit ``backend="triton"`` is returned as asked (the op then raises).
    """
    if backend is None:
        backend = env_backend() or ("triton" if x.is_cuda else "torch")
        if backend == "triton" and op is not None and op not in TRITON_OPS:
            backend = "torch"
        return backend
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected {' or '.join(BACKENDS)}")
    return backend


def validate_cu_seqlens(cu_seqlens: torch.Tensor, B: int, T: int) -> None:
    """Raise ValueError unless ``cu_seqlens`` is a valid int32 [n_docs + 1] layout of B rows of T tokens."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"cu_seqlens must be a tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(f"cu_seqlens must be int32, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D with >= 2 offsets, got shape {tuple(cu_seqlens.shape)}")
    cu = host_offsets(cu_seqlens)
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu[0].item()}")
    if cu[-1] != B * T:
        raise ValueError(f"cu_seqlens must end at B*T={B * T}, got {cu[-1].item()}")
    steps = cu[1:] - cu[:-1]
    if (steps < 0).any():
        i = int((steps < 0).nonzero()[0])
        raise ValueError(f"cu_seqlens decreases at index {i + 1}: {cu[i].item()} -> {cu[i + 1].item()}")
    row_ends = torch.arange(1, B + 1) * T
    missing = row_ends[~torch.isin(row_ends, cu)]
    if missing.numel():
        raise ValueError(f"cu_seqlens misses row end {missing[0].item()} (T={T}): a document spans two rows")


# Host copies of offsets on a device (``offsets_to_device``), by the address of the device storage: a weak
# reference to the device tensor, its version counter at the copy, and the int64 host copy. Reading them
# (``host_offsets``) costs no device sync, and a view of the device tensor (one run's row of a stack's
# [N, S + 1] offsets, as a per-run vmap rule sees it) finds the copy of its storage too.
_HOST_COPIES: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}


def host_to_device(a, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host array or tensor on ``device`` as ``dtype``: on CUDA through pinned memory, without waiting for the
    device (a copy from pageable memory waits for it, like a sync)."""
    t = torch.as_tensor(a).to(dtype)
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def offsets_to_device(cu_host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Offsets built on the host (int32, any shape) on ``device``, copied without a sync; on a device the host
    copy is remembered, so ``host_offsets`` and the ops' checks and plans read it instead of the device."""
    dev = host_to_device(cu_host, torch.int32, device)
    if dev.device.type != "cpu":
        remember_host_copy(dev, cu_host)
    return dev


def remember_host_copy(offsets: torch.Tensor, host: torch.Tensor) -> None:
    """Keep ``host`` (equal values, on the host, same shape) as what ``host_offsets`` returns for ``offsets`` and
    its views, until ``offsets`` is modified in place or freed."""
    for key in [k for k, (ref, _, _) in _HOST_COPIES.items() if ref() is None]:
        del _HOST_COPIES[key]
    _HOST_COPIES[offsets.untyped_storage().data_ptr()] = (weakref.ref(offsets), offsets._version,
                                                          host.to(torch.int64, copy=True).contiguous())


def host_offsets(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The offsets as an int64 host tensor: the host copy ``offsets_to_device`` kept for them (or for the tensor
    they are a view of), else read from the device (a sync on CUDA)."""
    ref, version, host = _HOST_COPIES.get(cu_seqlens.untyped_storage().data_ptr(), (None, None, None))
    base = None if ref is None else ref()
    if base is not None and version == cu_seqlens._version:
        offset = cu_seqlens.storage_offset() - base.storage_offset()
        return host.as_strided(cu_seqlens.shape, cu_seqlens.stride(), offset)
    return cu_seqlens.detach().cpu().long()


def max_docs_per_row(*doc_ids: torch.Tensor) -> int:
    """The most documents any row [.., T] of these doc_ids holds: the slot count of a static layout."""
    return max(int(((d[:, 1:] != d[:, :-1]).sum(dim=1) + 1).max()) for d in doc_ids)


def row_starts(doc_ids: torch.Tensor, slots: int) -> torch.Tensor:
    """doc_ids [R, T] -> int32 [R, slots]: each row's document starts (row-local, from 0), then T repeated (empty
    documents at the row end). ValueError when a row holds more than ``slots`` documents."""
    if doc_ids.dim() != 2:
        raise ValueError(f"doc_ids must be [R, T], got shape {tuple(doc_ids.shape)}")
    R, T = doc_ids.shape
    is_start = torch.ones_like(doc_ids, dtype=torch.bool)  # [R, T]
    is_start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    counts = is_start.sum(dim=1)
    if int(counts.max()) > slots:
        raise ValueError(f"slots={slots} is fewer than the {int(counts.max())} documents of a row")
    rows, cols = is_start.nonzero(as_tuple=True)  # every start, row by row, in order
    rank = is_start.long().cumsum(dim=1) - 1  # [R, T]: the index of each token's document in its row
    out = torch.full((R, slots), T, dtype=torch.int32, device=doc_ids.device)
    out[rows, rank[rows, cols]] = cols.to(torch.int32)
    return out


def rows_cu_seqlens(starts: torch.Tensor, T: int) -> torch.Tensor:
    """Row starts [..., B, S] (``row_starts`` of a batch's rows) -> cu_seqlens [..., B * S + 1]: the rows laid end
    to end on the flattened B * T axis, then B * T. A static shape for any layout (empty documents pad it), and
    no host read: the same on the host and on a device."""
    B = starts.shape[-2]
    offsets = starts + T * torch.arange(B, dtype=starts.dtype, device=starts.device)[:, None]  # [..., B, S]
    end = torch.full((*starts.shape[:-2], 1), B * T, dtype=starts.dtype, device=starts.device)
    return torch.cat([offsets.flatten(-2), end], dim=-1)


def doc_ids_to_cu_seqlens(doc_ids: torch.Tensor) -> torch.Tensor:
    """doc_ids: [B, T] integer, non-decreasing within each row -> cu_seqlens: int32 [n_docs + 1]."""
    if doc_ids.dim() != 2 or doc_ids.dtype.is_floating_point or doc_ids.dtype == torch.bool:
        raise ValueError(f"doc_ids must be integer [B, T], got {doc_ids.dtype} {tuple(doc_ids.shape)}")
    B, T = doc_ids.shape
    if B * T == 0:
        raise ValueError(f"doc_ids must be non-empty, got shape {(B, T)}")
    if (doc_ids[:, 1:] < doc_ids[:, :-1]).any():
        row = int((doc_ids[:, 1:] < doc_ids[:, :-1]).any(dim=1).nonzero()[0])
        raise ValueError(f"doc_ids must be non-decreasing within a row; row {row} decreases")
    is_start = torch.ones_like(doc_ids, dtype=torch.bool)  # [B, T]
    is_start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    starts = is_start.flatten().nonzero().flatten()
    end = torch.tensor([B * T], device=doc_ids.device)
    return torch.cat([starts, end]).to(torch.int32)


def _doc_index(cu_seqlens: torch.Tensor, B: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token of the flattened B*T axis: (index into cu_seqlens of its document's start, that start)."""
    cu = cu_seqlens.long()
    flat = torch.arange(B * T, device=cu.device)  # [B*T]
    # right=True skips empty documents: the last offset <= t is the start of the non-empty document holding t
    with warnings.catch_warnings():
        # under vmap (stacked runs, each with its own offsets) the batch rule expands the tokens, and the search
        # warns about the expanded (non-contiguous) view it copies
        warnings.filterwarnings("ignore", message="torch.searchsorted\\(\\): input value tensor is non-contiguous")
        doc = torch.searchsorted(cu, flat, right=True) - 1
    return doc, cu[doc]


def doc_positions(cu_seqlens: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """positions_in_doc without validation, for callers that already validated ``cu_seqlens``: [B, T] long."""
    _, start = _doc_index(cu_seqlens, B, T)
    return (torch.arange(B * T, device=start.device) - start).view(B, T)


def positions_in_doc(cu_seqlens: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """cu_seqlens: int32 [n_docs + 1] -> [B, T] long: t - start(doc(t)), 0 at each document's first token."""
    validate_cu_seqlens(cu_seqlens, B, T)
    return doc_positions(cu_seqlens, B, T)


def cu_seqlens_to_doc_ids(cu_seqlens: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """cu_seqlens: int32 [n_docs + 1] -> doc_ids: [B, T] long; each row's non-empty documents are 0, 1, ...

    Empty documents hold no token and get no number, so ``doc_ids_to_cu_seqlens`` of the result gives
    ``cu_seqlens`` with its repeated offsets removed.
    """
    validate_cu_seqlens(cu_seqlens, B, T)
    doc, _ = _doc_index(cu_seqlens, B, T)
    doc = doc.view(B, T)
    is_start = torch.ones_like(doc, dtype=torch.bool)  # [B, T]
    is_start[:, 1:] = doc[:, 1:] != doc[:, :-1]
    return is_start.long().cumsum(dim=1) - 1


def shift_in_doc(x: torch.Tensor, k: int, pos: torch.Tensor | None) -> torch.Tensor:
    """x: [B, T, D] -> [B, T, D] holding x[t - k], zero where t - k falls before the start of t's document.

    ``pos``: [B, T] positions in document (``doc_positions``), or None when each row is one document. Uses
    ``torch.where``, not a 0/1 product, so a NaN in another document stays out and its gradient is exactly 0.
    """
    T = x.shape[1]
    if k >= T:
        return torch.zeros_like(x)
    shifted = torch.nn.functional.pad(x[:, : T - k], (0, 0, k, 0))  # rows start with k zeros
    if pos is None or k == 0:
        return shifted
    return torch.where((pos >= k).unsqueeze(-1), shifted, 0.0)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """Half types compute in float32; float32 and float64 compute in their own precision."""
    return x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32


def check_tensor(name: str, t: torch.Tensor, dims: int, x: torch.Tensor | None = None) -> None:
    """Raise ValueError unless ``t`` is a floating tensor with ``dims`` dimensions on ``x``'s device."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")
    if 0 in t.shape:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(t.shape)}")
    if x is not None and t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


# cu_seqlens tensors already validated for a (B, T), with the tensor's version counter at the time: a model passes
# one layout to every layer, and validating reads its values on the host (a device sync on CUDA), so once suffices.
# Keyed by id() (a tensor's == is elementwise, so it cannot be a dict key); the weak reference tells a live
# tensor from a dead one whose id was reused.
_VALIDATED: dict[int, tuple[weakref.ref, tuple[int, int, int]]] = {}


def check_cu_seqlens(cu_seqlens: torch.Tensor | None, x: torch.Tensor) -> None:
    """Validate an op's optional ``cu_seqlens`` against ``x: [B, T, D]``, device included (once per layout).

    Offsets of stacked runs (inside ``torch.func.vmap``) pass unchecked: the engine builds them with
    ``rows_cu_seqlens``, valid by construction."""
    if cu_seqlens is None or torch._C._functorch.is_batchedtensor(cu_seqlens):
        return
    if cu_seqlens.device != x.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but x is on {x.device}")
    key = (x.shape[0], x.shape[1], cu_seqlens._version)
    ref, seen = _VALIDATED.get(id(cu_seqlens), (None, None))
    if ref is not None and ref() is cu_seqlens and seen == key:
        return
    validate_cu_seqlens(cu_seqlens, x.shape[0], x.shape[1])
    if len(_VALIDATED) > 256:
        for k in [k for k, (r, _) in _VALIDATED.items() if r() is None]:
            del _VALIDATED[k]
    _VALIDATED[id(cu_seqlens)] = (weakref.ref(cu_seqlens), key)


def check_cu_seqlens_eager(cu_seqlens: torch.Tensor | None, x: torch.Tensor) -> None:
    """``check_cu_seqlens`` for ops that torch.compile graphs call: validating reads the offsets on the host,
    which would break the graph, so only eager calls validate them."""
    if not torch.compiler.is_compiling():
        check_cu_seqlens(cu_seqlens, x)
