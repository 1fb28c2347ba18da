"""Where the executor runs: the variants table (variants), this host's GPUs (gpus), what each
variant needs of them (accelerators), CPU architectures (arch), image tags (image_tags), and the
launcher the image runs for a job (launcher)."""
