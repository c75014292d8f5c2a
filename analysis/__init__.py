"""Analysis of results: aggregation over seeds, MAD scoring, tables, figures, reports, leakage probes and
token representations.

Modules: ``aggregate`` (load run records, median/IQR/n over seeds, MAD scoring), ``tables`` (markdown and CSV),
``plots`` (seaborn figures), ``report`` (``mixlab report``), ``claims`` (papers' claims as checks, their verdicts),
``stats`` (intervals and tests over seeds), ``ledger`` (``mixlab claims``, reproductions/CLAIMS.md),
``leakage`` (the five cross-document probes), ``representations`` (hidden states per layer, cosine similarity,
PCA, linear probes for the previous token), ``packed_queries`` (packed associative retrieval accuracy by query
kind and distance from the document start), ``compare`` (``mixlab compare``: mixers side by side, a verdict per
pair), ``tensorboard`` (records as TensorBoard scalars, ``--log tensorboard``).
"""
