"""The ``mixlab`` command line: ``main`` (the app, ``mixlab run``, ``tasks``, ``mixers`` and the entry point
``main``), with the commands of ``sweep`` (sweeps, MAD, report, claims, archive), ``bench``, ``check``,
``leakage`` and ``ceilings``, each added by its ``register(app)``."""
