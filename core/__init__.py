"""What every other package of the lab builds on, importing none of them: typed fields (``fields``), atomic
writes and checked output folders (``atomic``), and the record store a run's record is read from (``records``)."""
