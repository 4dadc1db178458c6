"""``loopscope monitor``: a machine watched for days in bounded memory and disk.

Cheap detail for the whole run (a latency histogram per probe and period,
the maximum with its time, counts), expensive detail only around outliers
(the kernel's events, taken from its own ring buffers after the fact, and
their causes). ``start`` starts one, ``run`` is the loop, ``plan`` its checks and footprint, ``hist`` the histograms, ``keeper`` the
flight recorder and the explaining, ``lock`` one monitor per directory;
docs/monitor.md is the user's side.
"""
