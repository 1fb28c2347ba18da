"""`selftest`: trains a small job through the executor on this host and reports how it went
(command.py); what it reads of the host (devices.py), trains (workload.py), runs and
measures (runs.py), and reports (report.py)."""
