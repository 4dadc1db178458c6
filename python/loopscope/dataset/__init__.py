"""A directory of runs as one dataset.

Every run ``loopscope run`` records is a directory ``<results>/<YYYYmmdd-HHMMSS>-<name>``
whose ``tables/*.parquet`` carry, beside every row, what identifies the run
(``rundir.IDENTITY``: run id, experiment, host, kernel, loopscope version,
start time). So the directory that holds them is already a dataset any
Parquet reader takes as it is (``read_parquet('runs/*/tables/timer.parquet')``
in DuckDB, ``pl.scan_parquet`` in polars, Spark's ``spark.read.parquet``);
docs/tables.md says every column.

This package is loopscope's own reading of it:

- ``scan``: which directories are runs, what each is (from its ``run.json``
  and ``provenance.json``: the run record is the identity's source of
  truth, so runs recorded before their tables carried it are read too), and
  which cannot be read and why;
- ``query``: DuckDB, embedded, over the runs' files in place, with the views
  ``runs``, ``summary``, ``comparisons``, ``attribution``, ``records`` and
  one per table;
- ``trend``: a metric of a probe over runs, each with its interval, as a
  table and a page in the report's style.
"""
