"""The document cache: which scrapes may be answered from a stored copy (maxAge, minAge,
lockdown, storeInCache) and the copies themselves."""
