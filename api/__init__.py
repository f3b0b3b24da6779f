"""The registry service: FastAPI app (app.py), /v1 routes (routes/), problem+json errors,
bearer-token auth, request size limits."""
