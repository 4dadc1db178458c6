"""loopscope: how late soft-real-time work gets on commodity Linux, how often, and why.

The pieces follow the flow of data: :mod:`loopscope.trace` (instrument and
read traces), :mod:`loopscope.probes` (measure the machine),
:mod:`loopscope.loads` (background loads), :mod:`loopscope.spec` (experiment
files), :mod:`loopscope.lab` (one lab session: hosts, agents, links, clock
sync, kernel capture, teardown; the run's loop over it) and
:mod:`loopscope.agent` (one per host), :mod:`loopscope.kernel` (capture and
its stores), :mod:`loopscope.analysis` (statistics with their errors, the
causes of outliers), :mod:`loopscope.timeline` (every record on one clock),
:mod:`loopscope.report` (HTML, tables, terminal), :mod:`loopscope.monitor`
(the monitor's loop over a lab session, for days), :mod:`loopscope.dataset`
(many runs and monitors as one dataset; a fleet's page is the report's),
:mod:`loopscope.rundir` (what a run's and a monitor's directories hold,
declared), :mod:`loopscope.bench` (loopscope against its floor and its peers)
and :mod:`loopscope.cli` (each command's module imported only when it runs).

Imports are kept lazy: a probe process started by an agent must begin
measuring within a fraction of a second.
"""

import os as _os
from typing import Any

# numpy's BLAS starts worker threads that spin for a while after import,
# taking CPU from the probe next to them: loopscope does no BLAS-heavy work.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_var, "1")

if _os.environ.get("LOOPSCOPE_COMM"):
    # A lab component takes the name the lab gave it (``loopscope.selfname``)
    # at its first import, so that its start-up (the imports that follow,
    # a tenth of a second of CPU) is attributed to it, not to "python".
    from loopscope.selfname import from_env as _from_env

    _from_env()


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("loopscope")
        except PackageNotFoundError:  # running from a source tree without install
            v = "0.0.0+unknown"
        globals()["__version__"] = v
        return v
    raise AttributeError(name)
