"""alpha.17 as the stand-in plays it (docs/protocol.md): its batch scheduler, coordinator and
worker bridge, over the stand-in's shared cores. Retiring alpha.17 deletes this folder and
its rows in generations.py and worker/bridges.py."""
