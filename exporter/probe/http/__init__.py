"""How specwatch speaks HTTP: one aiohttp client, capped bodies under one deadline, failures mapped to reasons."""
