"""Statistics with their errors, comparisons, detectors and attribution.

This issue's part is :mod:`loopscope.analysis.stats`: latency summaries whose
every figure carries a confidence interval.
"""
