"""kiln's service: the FastAPI API, the database, the job queue and the workers.

Map:
- settings.py: one validated Settings from `KILN_*`; context.py: engine, sessions, queue,
  recovery of lost work; db.py, models.py, migrate.py (+ migrations/): the database.
- store/: the data layer, every query and write (jobs and the one enqueue path, entries,
  workers, tokens, the fast schedule read, admin reads, retention); hotpath.py: the
  connection pool of the schedule fetch every client start makes.
- api/: the app (app.py), dependencies (deps.py: auth, rate limit), routes/ per resource;
  intake.py validates submissions; errors.py gives every error one JSON shape.
- queue/: the interface, Redis streams (redis_streams.py, key names in keys.py), in-process.
- worker.py runs jobs; pipeline.py is what a job does (heuristic build, tuning).
"""
