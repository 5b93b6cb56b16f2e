# The tracker's steps by job, one module each (ingest, classify, ticks, dispatch) over the
# shared state and helpers of base.py; daemon/tracker/engine.py puts them together as `Tracker`.
