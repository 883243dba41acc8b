"""The REST API (FastAPI) under ``/api/v1``, with bearer-token auth, and the dashboard."""
