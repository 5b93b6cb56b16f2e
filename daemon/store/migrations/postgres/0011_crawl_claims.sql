-- Cluster mode for crawls: every instance fetches pages of a running crawl. A frontier row is
-- claimed by one process (`claimant`, cluster_members.claimant) while it stays 'queued'; a row
-- whose claimant is no longer a live member is claimed again. A crawl ends once, decided in one
-- transaction by one process: `ending` (completed | cancelled | failed) and `ended_by` (its
-- claimant, which then gives the job its final status; another process takes over when it died).
ALTER TABLE crawl_frontier ADD COLUMN claimant TEXT;
ALTER TABLE crawl_jobs ADD COLUMN ending TEXT;
ALTER TABLE crawl_jobs ADD COLUMN ended_by TEXT;
