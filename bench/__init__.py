"""Performance benchmarks of the executor; `python bench/run.py --help`."""
