"""Applications built on the library: the `mempo` command line, the demo, reports, the quickstart."""
