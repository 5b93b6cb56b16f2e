"""The job runs: the crawl service (scrape, crawl, batch, map), one page's pipeline (fetch or
render, document, formats, cache, tracking), the crawler's frontier and its store, commits and
endings."""
