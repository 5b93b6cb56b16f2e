"""Firecrawl v1: requests and answers of the v1 API translated to and from v2's."""
