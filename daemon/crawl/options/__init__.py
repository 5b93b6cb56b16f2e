"""Options: what a client sends and gets back, parsed and checked — scrape options, formats,
crawl/batch/map requests, crawl rules, response shapes. Pure values; no I/O."""
