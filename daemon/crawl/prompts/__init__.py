# Crawl prompts (Firecrawl's `prompt` on POST /v2/crawl and POST /v2/crawl/params-preview): a
# sentence becomes crawl options through one structured call of the LLM service over a map of the
# site (service.py), checked by crawld's own crawl rules and merged under the request's own keys
# (rules.py); the request and answer shapes of params-preview are in models.py.
