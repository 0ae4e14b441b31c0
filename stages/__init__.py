"""One entry point per DVC stage: read params, call the library in `scripts/`, write outputs atomically."""
