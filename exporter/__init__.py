"""specwatch: catch llama-server fleets that serve fill-in logprobs under speculative decoding."""

__version__ = "0.3.0"
