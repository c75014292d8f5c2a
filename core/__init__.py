"""What every other package of the lab builds on, importing none of them: typed fields (``fields``), atomic
writes and checked output folders (``atomic``), the record store a run's record is read from (``records``), and
code from outside mixlab loaded by import path or entry point (``plugins``: plugin mixers and tasks)."""
