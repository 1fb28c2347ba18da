"""Local stand-in for the Hypha side of the executor contract (a dev and CI tool, never production).

A per-job Job Bridge on a Unix socket (bridge_server, bridge_http, axum_body, backend); a
coordinator (coordinator, coordinator_http, coordinator_client) tying together the batch
scheduler (scheduler), the model store and data service (data_service), the parameter
server (aggregation, parameter_server) and the run's records (records, report); local
workers that run executors the way a Hypha worker does (worker); the embedded models and
data (assets, lenet) and the jobs that use them (jobs). `hypha-accelerate local
demo|coordinator|worker` (cli, demo).
"""
