"""The endpoints the router can send to and what it knows of each: the pool,
each endpoint's identity, load and in-flight counts, and what one request
weighs on it (``endpoints``); how full each is (``saturation``); reading
their health, load and models (``scrape``); which revision each serves
(``revisions``); and finding them, from the config file (``static``) or a
Kubernetes pod watch (``kubernetes``)."""
