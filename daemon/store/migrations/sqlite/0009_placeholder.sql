-- Placeholder for the tracker's 0009 (another branch): delete this file when merging it.
SELECT 1;
