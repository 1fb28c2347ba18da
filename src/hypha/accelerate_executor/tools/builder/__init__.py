"""`hypha-accelerate build`, a release tool: it builds images and the macOS bundle from a
checkout (docker/Dockerfile, docker/requirements), so the wheel leaves this package out
(pyproject.toml) and no worker host or image carries it; `hypha-accelerate build` there
says it needs a checkout (cli.py). Not named `build/`: .gitignore, ruff and pytest pass
over folders of that name."""
