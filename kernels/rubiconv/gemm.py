"""RubiConv in its GEMM form (docs/rubiconv.md), in torch matmuls: the plan of a packed layout, then the transform.

With w_n = exp(-2 pi i / n) and a block (column count) k, document i of length L_i is zero-padded to
``P_i = k * ceil((L_i + min(L_i, L_F) - 1) / k)`` tokens, ``m_i = P_i / k`` columns of k tokens:
``X[a, b] = x[a + k b]`` is column b of the padded document, the k tokens of one column contiguous in memory
(a ``view(m, k * D)``). Its length-P DFT at frequency ``c + m d`` is ``Y[d, c]`` with

    Z[c, a] = w_P^(a c) * sum_b w_m^(b c) X[a, b]        block stage (one F_m per document) + twiddle
    Y[d, c] = sum_a w_k^(d a) Z[c, a]                     F_k stage, the same for every column

x is real, so the spectrum is Hermitian and so is Z in c: ``Z[m - c] = conj(Z[c])``. Only the half columns
``c < m // 2 + 1`` are computed; the inverse of a Hermitian product spectrum W is then

    y[a + k b] = sum_{c <= m/2} Re(w_m^(-b c) O[c, a]),   O[c, a] = conj(w_P^(a c)) sum_d w_k^(-a d) W[d, c]

with ``W = Y * Hs`` and ``Hs[d, c] = alpha_c / P * H[c + m d]``: the 1/P of the inverse and the weight
alpha_c (1 for c = 0 and for c = m/2 when m is even, 2 for the columns that stand for a conjugate pair) are
folded into the filter spectrum. The filter is cut to ``min(L_F, ceil(P/2))`` taps before padding: that keeps
every tap a document of length <= (P+1)/2 uses and never wraps around, so one filter spectrum per distinct m
serves every document of that size. The filter spectra go through the same two stages as the data.

Documents are sorted by m; each distinct m is one batched block-stage GEMM; the F_k stage is one batched GEMM
over the half columns of every document and every filter. Every stage is linear, so autograd differentiates
the whole transform. ``kernels.rubiconv.triton`` fuses the same stages from the same ``RubiPlan``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch
from mixlab.kernels.utils import host_offsets, host_to_device

PRECISIONS = ("fp32", "bf16")
# Automatic block: the smallest power of two whose square covers the longest padded document (its F_k and
# F_m GEMMs then have about the same size), within these bounds.
MIN_BLOCK, MAX_BLOCK = 16, 512
# Shared padded sizes: a document may be padded past its shortest size (more zeros stay exact), and each distinct
# column count m costs a filter spectrum of its own (block and F_k stages forward, the correlation's inverse
# backward). MERGE_FILTER_COST is what one filter half column costs against one document half column: above 0,
# documents' m are rounded up to the sizes that minimise the sum of both (``shared_sizes``); 0 keeps every m.
# Chosen by timing the Triton op on the H100/H200 at `mixlab bench rubiconv`'s lognormal rows (see BENCHMARKS.md).
MERGE_FILTER_COST = 0.4
_PLANS: OrderedDict = OrderedDict()
_PLAN_CACHE_SIZE = 32


def padded_lengths(lengths: np.ndarray, L_F: int, k: int) -> np.ndarray:
    """P = k * ceil((L + min(L, L_F) - 1) / k): the shortest multiple of k with no wrap-around."""
    raw = lengths + np.minimum(lengths, L_F) - 1
    return k * -(-raw // k)


def shared_sizes(cols: np.ndarray, filter_cost: float) -> np.ndarray:
    """cols int64 [n_docs], each document's shortest column count m -> each rounded up to a kept size.

    Over every set of kept sizes drawn from the distinct m and holding the largest (a document only rounds up), the
    one that minimises the documents' half columns (m // 2 + 1 each) plus ``filter_cost`` times the kept sizes'
    half columns: a dynamic programme over the sorted distinct m, quadratic in their count; ties keep the smaller
    sizes. ``filter_cost`` <= 0 returns cols unchanged.
    """
    if filter_cost <= 0 or len(cols) == 0:
        return cols
    ms, counts = np.unique(cols, return_counts=True)
    half = ms // 2 + 1
    below = np.concatenate([[0], np.cumsum(counts)])  # documents with an m below each distinct m
    best = np.zeros(len(ms) + 1)  # best[i]: the cost of serving ms[:i] with ms[i - 1] kept
    cut = np.zeros(len(ms) + 1, dtype=np.int64)  # ... where ms[cut[i]:i] all round up to ms[i - 1]
    for i in range(1, len(ms) + 1):
        costs = [best[j] + (below[i] - below[j] + filter_cost) * half[i - 1] for j in range(i)]
        cut[i] = int(np.argmin(costs))
        best[i] = costs[cut[i]]
    size, i = np.empty_like(ms), len(ms)
    while i:
        size[cut[i] : i] = ms[i - 1]
        i = cut[i]
    return size[np.searchsorted(ms, cols)]


def auto_block(lengths: np.ndarray, L_F: int) -> int:
    """Smallest power of two k in [MIN_BLOCK, MAX_BLOCK] with k * k >= the longest unrounded padded length."""
    longest = int((lengths + np.minimum(lengths, L_F) - 1).max())
    k = MIN_BLOCK
    while k * k < longest and k < MAX_BLOCK:
        k *= 2
    return k


def _root(num: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Real and imaginary parts of w_n^num (float64), the exponent reduced mod n in integers first."""
    angle = (2 * np.pi / n) * (np.asarray(num, dtype=np.int64) % n)
    return np.cos(angle), -np.sin(angle)


@dataclass(eq=False)
class RubiPlan:
    """Everything of a packed layout the GEMM form needs, computed once on the host (``get_plan``).

    Documents (non-empty only) are sorted by column count m, stable, so each distinct m (a "group") holds a
    contiguous run of documents. Their half columns are numbered in that order (``doc_col``); the filter
    spectra, one per group, have their own half columns (``group_col``), which also number the rows of the
    twiddle and scale tables.
    """

    k: int
    n_tokens: int  # B * T
    L_F: int
    device: torch.device
    starts: np.ndarray  # int64 [n_docs]: first token on the flattened B*T axis
    lengths: np.ndarray  # int64 [n_docs]
    cols: np.ndarray  # int64 [n_docs]: m
    doc_col: np.ndarray  # int64 [n_docs]: first half column
    group_m: np.ndarray  # int64 [n_groups], increasing
    group_lo: np.ndarray  # int64 [n_groups]: documents [lo, hi) of the group
    group_hi: np.ndarray
    group_taps: np.ndarray  # int64 [n_groups]: min(L_F, ceil(P/2)), the filter taps of the group's spectrum
    group_reach: np.ndarray  # int64 [n_groups]: taps the group's documents can use, min(taps, longest doc)
    group_col: np.ndarray  # int64 [n_groups + 1]: first half column of each group's filter spectrum
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def n_docs(self) -> int:
        return len(self.lengths)

    @property
    def n_groups(self) -> int:
        return len(self.group_m)

    @property
    def half_cols(self) -> np.ndarray:
        """int64 [n_docs]: m // 2 + 1."""
        return self.cols // 2 + 1

    @property
    def n_cols(self) -> int:
        """Half columns of all documents."""
        return int(self.half_cols.sum())

    @property
    def n_filter_cols(self) -> int:
        return int(self.group_col[-1])

    @property
    def max_taps(self) -> int:
        """Filter taps any spectrum uses: the filter source is h[:, :max_taps]."""
        return int(self.group_taps.max())

    def work(self) -> int:
        """Real multiply-adds per channel of one forward in the GEMM form: the documents' block stage and its
        inverse (2 * k * mh * m each), the filters' block stage, and the F_k stage (4 * k * k a half column each
        way: forward and inverse for the documents, forward for the filters). A model to compare blocks k by,
        not a timing: the block stages grow with m * m and the F_k stage with k * k."""
        k, m, gm = self.k, self.cols, self.group_m
        mh, gh = m // 2 + 1, gm // 2 + 1
        return int(4 * k * (mh * m).sum() + 2 * k * (gh * gm).sum() + 8 * k * k * mh.sum() + 4 * k * k * gh.sum())

    def col_group(self) -> np.ndarray:
        """int64 [n_cols]: for each document half column, the filter half column of the same m and c."""
        out = []
        for g in range(self.n_groups):
            mh = int(self.group_m[g]) // 2 + 1
            n = int(self.group_hi[g] - self.group_lo[g])
            out.append(np.tile(np.arange(mh) + self.group_col[g], n))
        return np.concatenate(out)

    def tables(self) -> dict[str, np.ndarray]:
        """float64 DFT tables: F_k [k, k] (re, im), per group the block stage [mh, m], the twiddles
        [n_filter_cols, k] and the filter-spectrum scale alpha_c / P [n_filter_cols]."""

        def make() -> dict[str, np.ndarray]:
            k = self.k
            idx = np.arange(k)
            fk_r, fk_i = _root(np.outer(idx, idx), k)
            blocks, tw_r, tw_i, scale = [], [], [], []
            for m in self.group_m.tolist():
                mh, P = m // 2 + 1, k * m
                c = np.arange(mh)
                blocks.append(_root(np.outer(c, np.arange(m)), m))  # [mh, m] each
                r, i = _root(np.outer(c, idx), P)  # [mh, k]
                tw_r.append(r)
                tw_i.append(i)
                alpha = np.where((c == 0) | (2 * c == m), 1.0, 2.0)
                scale.append(alpha / P)
            return {
                "fk_r": fk_r,
                "fk_i": fk_i,
                "blocks": blocks,
                "tw_r": np.concatenate(tw_r),
                "tw_i": np.concatenate(tw_i),
                "scale": np.concatenate(scale),
            }

        return self.cached("np", make)

    def cached(self, key, make):
        """Device tensors derived from the plan, built once per key."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


def build_plan(
    cu_seqlens: torch.Tensor | None, B: int, T: int, L_F: int, block: int | None, device: torch.device,
    filter_cost: float | None = None,
) -> RubiPlan:
    """The plan of a validated layout (cu_seqlens int32 [n_docs + 1], or None: one document per row) for
    tensors on ``device``, its sizes shared at ``filter_cost`` (None: MERGE_FILTER_COST)."""
    rows = np.arange(B + 1, dtype=np.int64) * T
    offsets = rows if cu_seqlens is None else host_offsets(cu_seqlens).numpy()
    starts, lengths = offsets[:-1], offsets[1:] - offsets[:-1]
    keep = lengths > 0  # empty documents hold no token
    starts, lengths = starts[keep], lengths[keep]
    k = auto_block(lengths, L_F) if block is None else block
    cost = MERGE_FILTER_COST if filter_cost is None else filter_cost
    cols = shared_sizes(padded_lengths(lengths, L_F, k) // k, cost)
    order = np.argsort(cols, kind="stable")
    starts, lengths, cols = starts[order], lengths[order], cols[order]
    half = cols // 2 + 1
    doc_col = np.concatenate([[0], np.cumsum(half)[:-1]])
    group_m, group_lo, counts = np.unique(cols, return_index=True, return_counts=True)
    group_hi = group_lo + counts
    group_taps = np.minimum(L_F, -(-(k * group_m) // 2))
    longest = np.maximum.reduceat(lengths, group_lo)
    group_reach = np.minimum(group_taps, longest)
    group_col = np.concatenate([[0], np.cumsum(group_m // 2 + 1)])
    return RubiPlan(
        k=k,
        n_tokens=B * T,
        L_F=L_F,
        device=device,
        starts=starts,
        lengths=lengths,
        cols=cols,
        doc_col=doc_col,
        group_m=group_m,
        group_lo=group_lo,
        group_hi=group_hi,
        group_taps=group_taps,
        group_reach=group_reach,
        group_col=group_col,
    )


def get_plan(
    cu_seqlens: torch.Tensor | None, B: int, T: int, L_F: int, block: int | None, device: torch.device,
    filter_cost: float | None = None,
) -> RubiPlan:
    """``build_plan``, cached on the layout (the offsets' values), the filter length, the block, the device and
    the filter cost."""
    offsets = None if cu_seqlens is None else host_offsets(cu_seqlens).numpy().tobytes()
    cost = MERGE_FILTER_COST if filter_cost is None else filter_cost
    key = (offsets, B, T, L_F, block, str(device), cost)
    plan = _PLANS.get(key)
    if plan is None:
        plan = build_plan(cu_seqlens, B, T, L_F, block, torch.device(device), cost)
        _PLANS[key] = plan
        if len(_PLANS) > _PLAN_CACHE_SIZE:
            _PLANS.popitem(last=False)
    else:
        _PLANS.move_to_end(key)
    return plan


# ---- the transform in torch matmuls ----


def _gemm_tensors(plan: RubiPlan, dtype: torch.dtype) -> dict:
    """The plan's tables and gather indices as device tensors of ``dtype`` (float64 or float32)."""

    def make() -> dict:
        np_tables, dev, k = plan.tables(), plan.device, plan.k
        as_t = lambda a: host_to_device(a, dtype, dev)  # noqa: E731
        as_index = lambda a: host_to_device(a, torch.long, dev)  # noqa: E731
        pos = np.empty(plan.n_tokens, dtype=np.int64)  # token -> row of the padded, sorted layout
        gather, filters = [], []
        padded_start = np.concatenate([[0], np.cumsum(plan.cols * k)[:-1]])
        for g in range(plan.n_groups):
            lo, hi, m = int(plan.group_lo[g]), int(plan.group_hi[g]), int(plan.group_m[g])
            t = np.arange(m * k)
            inside = t[None, :] < plan.lengths[lo:hi, None]  # [n, m k]
            src = np.where(inside, plan.starts[lo:hi, None] + t, plan.n_tokens)  # padding reads the zero row
            gather.append(as_index(src))
            filters.append(as_index(np.where(t < plan.group_taps[g], t, plan.max_taps)))
        for i in range(plan.n_docs):
            L, s = int(plan.lengths[i]), int(plan.starts[i])
            pos[s : s + L] = padded_start[i] + np.arange(L)
        return {
            "fk_r": as_t(np_tables["fk_r"]),
            "fk_i": as_t(np_tables["fk_i"]),
            "blocks": [(as_t(r), as_t(i)) for r, i in np_tables["blocks"]],
            "tw_r": as_t(np_tables["tw_r"]).unsqueeze(-1),  # [n_filter_cols, k, 1]
            "tw_i": as_t(np_tables["tw_i"]).unsqueeze(-1),
            "scale": as_t(np_tables["scale"])[:, None, None],  # [n_filter_cols, 1, 1]
            "col_group": as_index(plan.col_group()),
            "gather": gather,
            "filters": filters,
            "pos": as_index(pos),
        }

    return plan.cached(("gemm", dtype), make)


def _matmul(precision: str):
    """Matmul in the working dtype, or with bfloat16 operands (fp32 accumulation) for precision "bf16"."""
    if precision == "bf16":
        return lambda a, b: torch.matmul(a.bfloat16(), b.bfloat16()).to(a.dtype)
    return torch.matmul


def _cmul(ar, ai, br, bi):
    return ar * br - ai * bi, ar * bi + ai * br


def rubiconv_gemm(x: torch.Tensor, h: torch.Tensor, plan: RubiPlan, precision: str = "fp32") -> torch.Tensor:
    """x: [B, T, D], h: [D, L_F] -> y: [B, T, D] in x's dtype, by the GEMM form in torch matmuls.

    float64 inputs compute in float64 (``precision`` ignored); others in float32 with float32 matmuls under
    torch's own float32 matmul setting (``torch.backends.cuda.matmul``), or bfloat16 operands for "bf16".
    """
    B, T, D = x.shape
    k, N = plan.k, plan.n_tokens
    wd = torch.float64 if x.dtype == torch.float64 else torch.float32
    mm = _matmul("fp32" if wd == torch.float64 else precision)
    t = _gemm_tensors(plan, wd)
    with torch.autocast(x.device.type, enabled=False):
        zero = x.new_zeros(1, D, dtype=wd)
        xf = torch.cat([x.reshape(N, D).to(wd), zero])  # [N + 1, D], row N is the padding
        hf = torch.cat([h[:, : plan.max_taps].to(wd).T, zero])  # [max_taps + 1, D]
        z_r, z_i, f_r, f_i = [], [], [], []
        for g in range(plan.n_groups):
            m = int(plan.group_m[g])
            c_r, c_i = t["blocks"][g]  # [mh, m]
            xs = xf[t["gather"][g]].view(-1, m, k * D)  # [n, m, k D]: column b of each padded document
            hs = hf[t["filters"][g]].view(1, m, k * D)
            z_r += [mm(c_r, xs).view(-1, k, D)]
            z_i += [mm(c_i, xs).view(-1, k, D)]
            f_r += [mm(c_r, hs).view(-1, k, D)]
            f_i += [mm(c_i, hs).view(-1, k, D)]
        n_cols = plan.n_cols
        rows = torch.cat([t["col_group"], torch.arange(plan.n_filter_cols, device=x.device)])
        # [n_cols + n_filter_cols, k, D]: documents' half columns, then the filters'
        z_r, z_i = _cmul(torch.cat(z_r + f_r), torch.cat(z_i + f_i), t["tw_r"][rows], t["tw_i"][rows])
        fk_r, fk_i = t["fk_r"], t["fk_i"]
        y_r = mm(fk_r, z_r) - mm(fk_i, z_i)  # F_k stage, one batched GEMM for all columns
        y_i = mm(fk_r, z_i) + mm(fk_i, z_r)
        h_r = (y_r[n_cols:] * t["scale"])[t["col_group"]]  # [n_cols, k, D]: alpha_c / P * H
        h_i = (y_i[n_cols:] * t["scale"])[t["col_group"]]
        w_r, w_i = _cmul(y_r[:n_cols], y_i[:n_cols], h_r, h_i)
        o_r = mm(fk_r, w_r) + mm(fk_i, w_i)  # conj(F_k) stage
        o_i = mm(fk_r, w_i) - mm(fk_i, w_r)
        cg = t["col_group"]
        o_r, o_i = _cmul(o_r, o_i, t["tw_r"][cg], -t["tw_i"][cg])
        out, col = [], 0
        for g in range(plan.n_groups):
            m = int(plan.group_m[g])
            mh, n = m // 2 + 1, int(plan.group_hi[g] - plan.group_lo[g])
            c_r, c_i = t["blocks"][g]
            part_r = o_r[col : col + n * mh].reshape(n, mh, k * D)
            part_i = o_i[col : col + n * mh].reshape(n, mh, k * D)
            # Re(w_m^(-b c) O[c]) = Re(w_m^(b c)) O_r + Im(w_m^(b c)) O_i
            out.append((mm(c_r.T, part_r) + mm(c_i.T, part_i)).reshape(n * m * k, D))
            col += n * mh
        y = torch.cat(out)[t["pos"]]  # [N, D]
    return y.view(B, T, D).to(x.dtype)
