"""The training loop and its parts: the rank's main (main), a folder per bridge generation
(alpha17/, actions/: each its loop and what only it needs), what both share (workbench,
settings, steps, data, diloco, round_metrics, model_output, ...). `python -m
hypha.accelerate_executor.training` runs one rank (__main__)."""
