"""The ``mixlab`` command line: ``main`` (the app, ``mixlab run``, ``tasks``, ``mixers`` and the entry point
``main``), with the commands of ``sweep`` (sweeps, MAD, report, claims, archive), ``compare``, ``bench``, ``check``
(check-mixer, check-task), ``leakage`` and ``ceilings``, each added by its ``register(app)``; ``settings`` reads
what ``--set`` and a run file (``--config``) give."""
