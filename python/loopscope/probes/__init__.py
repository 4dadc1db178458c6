"""Probes: native loops that measure the machine, with Python front ends.

Each module runs one probe through :mod:`loopscope._native`, writes its
records into a trace, and returns a result whose figures carry their errors.
"""
