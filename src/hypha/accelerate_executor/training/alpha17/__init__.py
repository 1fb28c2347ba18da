"""alpha.17's training loop (docs/protocol.md): the loop (loop), its statuses without waiting (status_reporter), its DiLoCo sync round (synchroniser) and its bridge routes (bridge)."""
