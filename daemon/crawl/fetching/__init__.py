"""Fetching: one GET through the SSRF guard, redirects, proxies, the per-host gate, URL
normalisation, and the vetting proxy the browser goes through. Imports only the area's
foundation (config, proxies, problems)."""
