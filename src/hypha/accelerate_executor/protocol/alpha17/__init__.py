"""alpha.17's side of the protocol (docs/protocol.md): its job types (job) and messages (messages)."""
