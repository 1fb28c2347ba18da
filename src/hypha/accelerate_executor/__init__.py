"""Hypha's DiLoCo training executor on HuggingFace Accelerate.

Importing this package must stay cheap and torch-free: the host shim imports it.
"""

__version__ = "0.1.0"
