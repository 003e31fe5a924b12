"""Shared test support: the llama-server wire model, its hosts (mock transport, loopback sockets, a fleet), process and network helpers."""
