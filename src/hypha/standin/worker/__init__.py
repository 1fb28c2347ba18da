"""A Hypha worker (worker) and its Job Bridge (bridge_*, axum_body); what it spawns
(executor_entries), its work dirs (work_dirs) and the executor's echoed stdout (stdout_echo)."""
