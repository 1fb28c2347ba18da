"""The coordinator: jobs tying the services together (core), its TCP API (http_api, client),
the two served (server), and the run's records and verdict (records, report)."""
