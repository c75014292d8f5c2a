"""Analysis of results: aggregation over seeds, MAD scoring, tables, figures, reports and leakage probes.

Modules: ``aggregate`` (load run records, median/IQR/n over seeds, MAD scoring), ``tables`` (markdown and CSV),
``plots`` (seaborn figures), ``report`` (``mixlab report``), ``leakage`` (the five cross-document probes).
"""
