"""Tools for the processes of one host: spawning and reaping them
(``procs``), their cgroups (``cgroup``), what the machine is
(``provenance``). The agent uses them on its host and the lab on the
controller's, so they sit below both."""
