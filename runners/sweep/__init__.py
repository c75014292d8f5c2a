"""Sweeps: a grid file (``spec``, packaged ``presets/``) or the MAD protocol (``mad``) planned as runs named by
their config hash (``plan``), grouped into jobs (``jobs``) and run by a backend (``local_backend``,
``ray_backend``) into an output folder with its manifest (``manifest``), resumably (``run``); what a sweep costs
or still lacks (``cost``)."""
