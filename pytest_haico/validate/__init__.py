"""`haico validate`: a backend developer's check of a change in one command — the selected
items run against a baseline and a candidate build on one model, then compared."""
