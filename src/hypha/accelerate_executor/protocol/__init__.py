"""The protocol between this executor and the Hypha worker, torch-free: the job spec and its
serde-exact reading (job, serde_json, serde), the task table (tasks), what every message is
made of (messages), one folder per bridge generation with its job types and its messages
(alpha17/, actions/), and which generation a job is for (generation). The executor and the
local stand-in both speak through what is here."""
