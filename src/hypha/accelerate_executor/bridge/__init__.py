"""The Job Bridge client, both generations: alpha.17's routes (client), the action protocol's
(action_client, actions), one status per batch and the update stream (progress), the HTTP it
speaks over the Unix socket (http_wire), and no path outside the work dir (paths)."""
