"""Probing llama-servers: HTTP, the endpoint table, answer parsers and the token classifier; no metrics, no scheduler."""
