"""The worker: registers, heartbeats, claims executions dispatched to it, runs them."""
