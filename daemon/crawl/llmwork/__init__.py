# The model's work on one page beyond json and summary: the `question`, `highlights` and
# deprecated `query` formats (rules.py: what a request may ask and what counts as a verbatim
# passage; answers.py: the calls through the daemon's LlmService). The options room checks and
# plans these formats with them; the page pipeline (runs/pages.py) runs them after the page's
# markdown exists.
