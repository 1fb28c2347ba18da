"""Local stand-in for the Hypha side of the executor contract (a dev and CI tool, never production).

Four services, a folder each, as both generations share them: worker/ (a Hypha worker that runs
executors the way the real one does, and the shared core of its per-job Job Bridge on a Unix
socket), parameter_server/ (the rounds, their true mean), data_service/ (the model store, the
slices, the embedded models and data); coordinator/ ties them together as jobs and serves them
on TCP. What a generation adds (its scheduler, coordinator and bridge) is in its own folder:
alpha17/ and actions/; generations.py and worker/bridges.py are the one place each side names
them. At the top: the stand-in's errors (errors), the contract between a bridge and what lies
beyond it (backend), the job status workers report (job_status), the jobs (jobs), socket
plumbing (serving), whole-line printing (console), an OTLP receiver (otlp_receiver), and
`hypha-accelerate local demo|coordinator|worker` (cli, demo).
"""
