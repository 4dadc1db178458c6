"""Kernel events on the run's clock: capture (``capture``), reading them into a
table (``events``), and the causes of an interval they explain
(``loopscope.analysis.attribution``)."""
