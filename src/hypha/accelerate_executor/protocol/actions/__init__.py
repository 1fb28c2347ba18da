"""The action protocol (docs/protocol-actions.md): its job types (job) and messages (messages)."""
