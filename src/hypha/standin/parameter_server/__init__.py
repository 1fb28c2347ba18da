"""The parameter server: the rounds (server) and their true mean with Nesterov momentum (aggregation)."""
