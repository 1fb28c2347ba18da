"""Local stand-in for the Hypha side of the executor contract (a dev and CI tool, never production).

A per-job Job Bridge on a Unix socket (bridge_server), a coordinator playing scheduler,
data service, model store and parameter server (coordinator, parameter_server), local
workers that run executors the way a Hypha worker does (worker), and an embedded tiny
model and data set (assets). `hypha-accelerate local demo|coordinator|worker` (cli).
"""
