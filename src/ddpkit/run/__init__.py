"""`ddpkit run` and `ddpkit env`: torchrun's argv, nodes, network checks, rendezvous, the failure report, and `ddpkit.launch` of a Python function."""
