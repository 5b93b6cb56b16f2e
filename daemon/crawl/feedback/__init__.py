"""Feedback on crawld's answers (firecrawl-mcp's `firecrawl_feedback` and
`firecrawl_search_feedback`): validated, stored, listed for the console and GET /v2/feedback."""
