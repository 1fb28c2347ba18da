"""The host shim: what runs one job's executor container for a Hypha worker."""
