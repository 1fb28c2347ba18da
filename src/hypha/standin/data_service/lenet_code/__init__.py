"""The embedded LeNet's remote code: these two files are shipped into the model store beside
config.json, as a Hugging Face repository with `auto_map` ships its own model classes."""
