-- Cluster mode: a processing schedule names the process that claimed it (Cluster.claimant,
-- "instance/incarnation"), so only that process may finish it, and a schedule whose claimant is
-- no live member any more is handed back to pending (daemon/tracker/store.py, reclaim).
-- Rows processing before this migration have none: they were left by a stopped process.
ALTER TABLE tracker_schedules ADD COLUMN claimant TEXT;
