"""One run and many: what defines a run (``config``), what it resolves to, once (``resolved``), the one-run loop
(``run``), the stacked engine (``engine``) and what both loops share, once each: data and initial weights from the
seeds (``seeds``), the step plan and learning rates (``schedule``), precision (``precision``), evaluation
(``evaluation``, ``metrics``), the record (``record``, ``provenance``), mid-training checkpoints (``resume``) and
the engine's speed modes (``speed``)."""
