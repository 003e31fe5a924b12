"""The daemon: watcher, schedule, state snapshots, the Prometheus collector and the web endpoint."""
