"""kiln's service: the FastAPI API, the database, the job queue and the workers.

Map:
- settings.py: one validated Settings from `KILN_*`; context.py: engine, sessions, queue,
  recovery of lost work; db.py, models.py, migrate.py (+ migrations/): the database.
- store.py: submissions, lookups and job transitions; admin_queries.py: what the admin
  routes and the dashboard show; hotpath.py: the schedule fetch every client start makes.
- api/: the app (app.py), dependencies (deps.py: auth, rate limit), routes/ per resource;
  intake.py validates submissions; errors.py gives every error one JSON shape.
- queue/: the interface, Redis streams (redis_streams.py, key names in keys.py), in-process.
- worker.py runs jobs; pipeline.py is what a job does (heuristic build, tuning).
"""
