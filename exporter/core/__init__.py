"""The spine: what specwatch knows of each server (state), decides of it (verdict, peers) and reports, and the runner."""
