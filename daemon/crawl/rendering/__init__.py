"""Rendering: the supervised headless Chromium (CDP over a pipe), page rendering, actions
and screenshots, and their pure rules. Above fetching."""
