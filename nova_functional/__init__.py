"""Nova's own functional harness judging what the charm publishes (``make nova-functional``)."""
