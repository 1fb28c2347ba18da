"""The host shim: runs executor containers for a Hypha worker, and builds their images."""
