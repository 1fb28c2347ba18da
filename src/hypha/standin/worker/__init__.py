"""A Hypha worker (worker), the bridge it serves per generation (bridges) and what every bridge
shares (bridge_*, axum_body); what it spawns (executor_entries), its work dirs (work_dirs) and
the executor's echoed stdout (stdout_echo)."""
