"""Search: /v2/search through the configured SearXNG, with results optionally scraped."""
