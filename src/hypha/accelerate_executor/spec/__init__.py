"""The job spec: the job as Hypha sends it (job), read exactly as serde_json and serde read it
(serde_json, serde), and the task table (tasks)."""
