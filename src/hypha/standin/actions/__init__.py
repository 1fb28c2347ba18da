"""The action protocol as the stand-in plays it (docs/protocol-actions.md): its scheduler,
coordinator and worker bridge, over the stand-in's shared cores."""
