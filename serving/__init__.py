"""Serving HTTP with aiohttp as every part does (the router, the simulator,
the extender, the command line's listening socket): binding, accepting,
running an app until SIGTERM, and refusing HTTP the parser cannot read in the
app's own JSON error shape (``http``)."""
