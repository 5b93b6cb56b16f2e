"""Monitors (Firecrawl's /v2/monitor): scheduled checks of pages and sites, each page compared
with its previous snapshot."""
