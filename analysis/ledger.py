"""The claims ledger (``mixlab claims``, ``reproductions/CLAIMS.md``): every claim of the papers mixlab reproduces,
with its verdict on the folders of records given, the evidence and the deviations from the paper's protocol.

``PAPERS`` lists the papers and where their claims live: the MAD table's in ``analysis.tables``
(``claims.mad_claims``), a grid's in its sweep file's ``reference.claims`` (the manifest's copy is judged; when no
folder holds records, the file of the first sweep named supplies them: ``PRESET_SWEEPS``, whose claims the caller
reads and passes in), and claims with no check yet as sentences.
A folder's deviations: its sweep file's ``reference.deviations``, or for MAD its profile's summary, then what
the records show (seeds, runs without a record); the NOTES.md beside a folder holds the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mixlab.analysis import claims
from mixlab.analysis.aggregate import SweepData
from mixlab.analysis.report import read_folders
from mixlab.analysis.tables import Table, reference_name

NOTES = "NOTES.md"
MARKS = "abcdefghijklmnopqrstuvwxyz"  # how a row cites its evidence's deviations, listed below the table


@dataclasses.dataclass(frozen=True)
class Paper:
    """A paper's claims: from the MAD table (``mad``), from the grid sweeps named ``sweeps`` (manifest names),
    or ``sentences`` that nothing checks yet."""

    title: str
    sweeps: tuple[str, ...] = ()
    mad: bool = False
    sentences: tuple[str, ...] = ()


PAPERS = (
    Paper("Dynamic Short Convolutions Improve Transformers: the MAD table", mad=True),
    Paper("Dynamic Short Convolutions Improve Transformers: Figure 2, variable-length-key MQAR",
          sweeps=("mqar_varlen_fig2", "mqar_varlen_fig2_lr1e-3", "mqar_varlen_small")),
    Paper("RubiConv: packed associative retrieval and packed noisy recall",
          sweeps=("packed_rubiconv", "packed_small", "packed_small_5k", "packed_mq", "packed_mq_small",
                  "packed_mq_control", "packed_mq_control_small")),
    Paper("Zoology: MQAR, its Figure 2 and its repository's recall-memory figure",
          sweeps=("baselines_mqar_zoology", "baselines_mqar_zoology_small", "baselines_mqar_mid",
                  "baselines_mqar_small", "baselines_mqar")),
    Paper("Convolutions for Large Language Models: the post-QKV conv case study",
          sentences=("A short conv after the Q, K and V projections makes a token's hidden state carry the tokens "
                     "just before it (docs/representations.md).",)),
)
# The sweeps whose files' reference.claims stand for a paper that no folder given holds records of.
PRESET_SWEEPS = tuple(paper.sweeps[0] for paper in PAPERS if paper.sweeps)
PresetClaims = Mapping[str, Sequence[Mapping[str, Any]]]  # sweep name -> its file's reference.claims


@dataclasses.dataclass
class Evidence:
    """The folders that judge a paper's claims together (one grid sweep, or the MAD folders of one profile),
    their verdicts, and the deviations from the paper's protocol that might matter."""

    name: str
    datas: list[SweepData]
    verdicts: list[claims.Verdict]
    deviations: list[str]

    def counts(self) -> str:
        """``594 runs, seeds 0-2``: the records read and their seeds."""
        runs = sum(len(d.records) for d in self.datas)
        seeds = sorted({row["seed"] for d in self.datas for row in d.rows})
        return f"{runs} runs, seeds {_span(seeds)}"

    def folders(self) -> str:
        return ", ".join(f"`{d.path}`" for d in self.datas)


def _span(seeds: Sequence[int]) -> str:
    """``[0, 1, 2]`` -> ``"0-2"``; seeds with gaps listed; none -> ``"none"``."""
    if len(seeds) > 1 and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds)) or "none"


def grid_evidence(data: SweepData) -> Evidence:
    deviations = list((data.spec.get("reference") or {}).get("deviations", []))
    return Evidence(data.name, [data], claims.grid_verdicts(data), deviations + _record_facts([data]))


def mad_evidence(datas: Sequence[SweepData]) -> list[Evidence]:
    """One Evidence per MAD profile among ``datas``."""
    out = []
    judged = claims.mad_judged(datas)
    for profile, verdicts in claims.mad_verdicts(datas).items():
        mine = list(judged[profile].values())
        summary = mine[0].spec.get("profile", {}).get("summary", "")
        older = [d for d in datas if d.kind == "mad" and d.spec.get("profile", {}).get("name") == profile
                 and reference_name(d) is not None and all(d is not m for m in mine)]
        superseded = [f"superseded by a newer folder of the same model and profile: "
                      f"{', '.join(f'`{d.path}`' for d in older)}"] if older else []
        out.append(Evidence(f"MAD, {profile} profile", mine, verdicts,
                            [f"profile {profile}: {summary}"] + _record_facts(mine, paper_seeds=1) + superseded))
    return out


def _record_facts(datas: Sequence[SweepData], paper_seeds: int | None = None) -> list[str]:
    """What the records themselves say about the protocol: the seeds, and planned runs without a record."""
    seeds = len({row["seed"] for d in datas for row in d.rows})
    facts = [f"{seeds} seeds" + (f" (the paper: {paper_seeds})" if paper_seeds else "")]
    missing = sum(d.missing for d in datas)
    if missing:
        planned = sum(len((d.manifest or {}).get("runs", [])) for d in datas)
        facts.append(f"{missing} of {planned} planned runs have no record")
    notes = sorted({str(d.path.parent / NOTES) for d in datas if (d.path.parent / NOTES).is_file()})
    return facts + [f"more in `{n}`" for n in notes]


def paper_claims(paper: Paper, preset_claims: PresetClaims) -> list[claims.Claim]:
    """The claims of a paper when no folder holds its records: the MAD table's, or those of its first sweep's file
    (``preset_claims``)."""
    if paper.mad:
        return claims.mad_claims()
    if paper.sweeps:
        items = preset_claims[paper.sweeps[0]]
        return [claims.parse_claim(item, f"{paper.sweeps[0]}: reference.claims[{i}]") for i, item in enumerate(items)]
    return []


LEDGER_HEADERS = ["claim", "at", "verdict", "effect [95% interval], n", "p (sign)", "evidence", "deviations"]


def paper_rows(paper: Paper, evidence: Sequence[Evidence], preset_claims: PresetClaims) -> list[list[str]]:
    """One row per claim and split of each evidence; the claims without any scored seed in one evidence share
    one row; a paper without evidence gets one row per claim saying so."""
    if not evidence:
        texts = [c.text for c in paper_claims(paper, preset_claims)] + list(paper.sentences)
        return [[text, "—", "no runs", "—", "—", "no records in the folders given", "—"] for text in texts]
    rows = []
    for mark, item in zip(MARKS, evidence):
        scored = [v for v in item.verdicts if v.n]
        for v in scored:
            interval = f" {v.interval_text()}" if v.interval else ""
            needed = v.needed_text()
            verdict = f"{v.verdict_text()}, {needed} seeds to decide" if needed else v.verdict_text()
            rows.append([v.claim.text, claims.split_text(v.split), verdict,
                         f"{v.effect_text()}{interval}, n={v.n}", claims.p_text(v), f"{item.name} ({item.counts()})",
                         f"({mark})"])
        unscored = len(item.verdicts) - len(scored)
        if unscored:
            rows.append([f"{unscored} more claims of this paper", "—", "no data (no scored seeds)", "—", "—",
                         f"{item.name} ({item.counts()})", f"({mark})"])
    return rows


def ledger_markdown(datas: Sequence[SweepData], preset_claims: PresetClaims) -> str:
    """CLAIMS.md for the folders read: per paper a table of its claims' verdicts, then its evidence and the
    deviations, lettered as the rows cite them; grid sweeps no paper lists come last. ``preset_claims`` holds the
    ``reference.claims`` of the files of ``PRESET_SWEEPS``, for the papers without records."""
    grids = [d for d in datas if d.kind == "grid"]
    lines = ["# Claims ledger", "",
             "Every claim of the papers mixlab reproduces, judged on the committed run records. Generated by",
             "", "    mixlab claims reproductions/ --out reproductions/CLAIMS.md", "",
             "(do not edit by hand; docs/claims.md says how verdicts are decided). " + claims.VERDICT_RULE, ""]
    listed = {name for paper in PAPERS for name in paper.sweeps}
    sections = [(paper, mad_evidence(datas) if paper.mad else
                 [grid_evidence(d) for name in paper.sweeps for d in grids if d.name == name]) for paper in PAPERS]
    others = [grid_evidence(d) for d in grids if d.name not in listed and claims.sweep_claims(d)[0]]
    if others:
        sections.append((Paper("Other sweeps with claims"), others))
    for paper, evidence in sections:
        table = Table(list(LEDGER_HEADERS), paper_rows(paper, evidence, preset_claims))
        lines += [f"## {paper.title}", "", table.markdown(), ""]
        for mark, item in zip(MARKS, evidence):
            lines += [f"({mark}) {item.name}: {item.folders()}. Deviations from the paper's protocol:", "",
                      *(f"- {d}" for d in item.deviations), ""]
        unrun = [name for name in paper.sweeps if all(d.name != name for d in grids)]
        if unrun:
            lines += ["Sweeps of this paper with no folder of their own here: " + ", ".join(f"`{n}`" for n in unrun)
                      + ".", ""]
    return "\n".join(lines)


def write_ledger(folders: Sequence[str | Path], preset_claims: PresetClaims, out: str | Path | None = None) -> str:
    """The ledger of ``folders`` (``report.read_folders``), written to ``out`` when given; returns its text.
    ``preset_claims``: as ``ledger_markdown``'s."""
    text = ledger_markdown(read_folders(folders), preset_claims)
    if out is not None:
        Path(out).write_text(text + "\n")
    return text
