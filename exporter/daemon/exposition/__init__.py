"""/metrics: the family catalog, samples from state, the incremental text renderer, and what each scraper is served."""
