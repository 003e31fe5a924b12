"""The eval side: check a server, ask a running specwatch, judge answers received or saved, and gate a pytest session."""
