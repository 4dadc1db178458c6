"""Running experiments: the controller, hosts and agents, cgroups, clean-up."""
