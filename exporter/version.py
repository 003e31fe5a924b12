"""The release, on the ground floor: the command line, the daemon and the public face all read it here."""

__version__ = "0.6.0"
