"""Operator tools: doctor, worker-config, build, publish, selftest."""
