"""Background loads: worker processes the agent starts at a level.

A load runs as ``level`` worker processes (``python -m
loopscope.loads.worker``), each doing the native unit of work of its kind
(``crates/loads``) flat out or at a duty cycle, or as copies of an external
command. The agent puts them in a cgroup of their own (accounting and a
reliable kill); each worker also dies with its parent.
"""
