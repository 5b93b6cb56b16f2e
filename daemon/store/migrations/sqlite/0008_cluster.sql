-- Cluster mode (daemon/cluster/): the instances sharing this store and the leases they hold.
-- On SQLite there is one member and it holds every lease; the tables are the same so the same
-- code runs. Instants are the database's clock (crawld_now_ms(), registered by the backend), so
-- hosts whose clocks drift still agree on when a lease ran out.
CREATE TABLE cluster_members (
    instance     TEXT PRIMARY KEY,       -- [cluster] instance (default: the host name)
    claimant     TEXT NOT NULL UNIQUE,   -- instance/incarnation: new for every process start
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    http         TEXT,                   -- where its API listens, as it reported
    version      TEXT NOT NULL,
    offers       TEXT NOT NULL DEFAULT '{}',  -- JSON: collector tasks, proxies, settings digest
    started_ms   INTEGER NOT NULL,
    heartbeat_ms INTEGER NOT NULL,
    expires_ms   INTEGER NOT NULL
) WITHOUT ROWID;

-- What must run in one place at a time. `token` grows by one at every change of holder: it is
-- the fencing token every write made on the strength of the lease checks in its transaction.
CREATE TABLE cluster_leases (
    name         TEXT PRIMARY KEY,       -- e.g. collector:<task>, webhook:<job>, tracker:discovery
    holder       TEXT NOT NULL,          -- instance name
    token        INTEGER NOT NULL,
    acquired_ms  INTEGER NOT NULL,
    expires_ms   INTEGER NOT NULL
) WITHOUT ROWID;

-- Requests for the holder of a lease (start a task it owns, stop a crawl it runs): written by
-- whichever instance took the API call, taken by the holder.
CREATE TABLE cluster_requests (
    id           INTEGER PRIMARY KEY,
    lease        TEXT NOT NULL,
    action       TEXT NOT NULL,
    body         TEXT NOT NULL DEFAULT '{}',
    from_instance TEXT NOT NULL,
    created_ms   INTEGER NOT NULL
);
CREATE INDEX cluster_requests_lease ON cluster_requests(lease, id);
