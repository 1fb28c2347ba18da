"""Local stand-in for the Hypha side of the executor contract (a dev and CI tool, never production).

Four services, a folder each: worker/ (a Hypha worker that runs executors the way the real one
does, and its per-job Job Bridge on a Unix socket), scheduler/ (alpha.17's batch scheduler and
the action-era one), parameter_server/ (the rounds, their true mean), data_service/ (the model
store, the slices, the embedded models and data); coordinator/ ties them together as jobs and
serves them on TCP. At the top: the contract between a bridge and what lies beyond it (backend),
the job status workers report (job_status), the jobs (jobs), socket plumbing (serving), whole-line
printing (console), an OTLP receiver (otlp_receiver), and `hypha-accelerate local
demo|coordinator|worker` (cli, demo).
"""
