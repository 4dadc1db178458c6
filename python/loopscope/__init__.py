"""loopscope: how late soft-real-time work gets on commodity Linux, how often, and why.

The pieces follow the flow of data: :mod:`loopscope.trace` (instrument and
read traces), :mod:`loopscope.probes` (measure the machine),
:mod:`loopscope.analysis` (statistics with their errors),
:mod:`loopscope.bench` (loopscope against its floor and its peers) and
:mod:`loopscope.cli` (the ``loopscope`` command).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("loopscope")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+unknown"
