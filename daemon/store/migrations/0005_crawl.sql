-- Crawl API (Firecrawl v2 scrape/crawl/batch/map): frontier and documents per job.
-- (Filled in by the crawl work; kept as a numbered step so later migrations keep their numbers.)
SELECT 1;
