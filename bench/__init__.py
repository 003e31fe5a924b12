"""Fleet-scale tooling: a simulated llama-server fleet, a config generator and the benchmark."""
