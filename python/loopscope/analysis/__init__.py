"""Comparisons, detectors, breakdowns and attribution over a run's records.

The latency summaries every figure of which carries a confidence interval
are one layer lower, in :mod:`loopscope.stats`, because the probes use them
too and imports point down.
"""
