"""`selftest`: trains a small job through the executor on this host and reports how it went
(command.py); what it reads of the host (devices.py), trains (workload.py), runs and
measures (runs.py), and reports (report.py).

A package of its own, above both the executor (hypha.accelerate_executor) and the local
stand-in (hypha.standin), since it drives one through the other: the executor's command
layer (cli.py, image_entry.py) starts it, and nothing else of the executor imports it."""
