"""kiln's service: the FastAPI API, the database, the job queue and the workers."""
