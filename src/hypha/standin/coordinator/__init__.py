"""The coordinator: what every generation's shares, jobs tying the services together (core), a
bridge's calls in this process (in_process), its TCP API (http_api, client), the two served
(server), and the run's records and verdict (records, report)."""
