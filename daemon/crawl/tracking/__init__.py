"""Change tracking: comparing a page with its previous copy (git-diff and json modes) and the
store of previous copies."""
