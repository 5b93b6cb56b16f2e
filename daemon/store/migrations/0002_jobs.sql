-- Jobs, their rows and errors (daemon/jobs/store.py).
SELECT 1;
