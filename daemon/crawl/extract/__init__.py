"""/v2/extract: durable extract jobs — plan, gather pages (search, map, scrape), ask the model,
merge the answers."""
