"""The training loop and its parts: alpha.17's rounds (alpha17_loop), the action protocol's
(action_loop), what both share (workbench) and what they stack on. `python -m
hypha.accelerate_executor.training` runs one rank (__main__)."""
