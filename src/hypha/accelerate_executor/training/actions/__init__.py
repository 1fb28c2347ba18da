"""The action protocol's training loop (docs/protocol-actions.md): the loop (loop), the aggregate exchange (exchange), the speculative step (speculative) and its bridge routes (bridge)."""
