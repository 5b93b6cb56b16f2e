"""Discovery: robots.txt and sitemaps, how a crawl finds and is allowed to visit URLs.
Above fetching and content."""
