"""The agent that runs on each host of an experiment; see :mod:`.server`."""
