"""Rules: criteria on event payloads and the executions they request (issue #13)."""
