"""The router as an endpoint picker (EPP) of the Gateway API Inference
Extension: a gRPC server speaking Envoy's external processing protocol,
asked by a proxy which endpoint serves each request. ``protocol`` is the
wire (the messages and the extension's header and metadata keys),
``reading`` what a request body asks, ``picker`` one request's stream
through the router's own stages (admit, schedule, settle: the director's),
``turns`` a Responses turn's answer stamped and stored on its way,
``server`` the process: the router's parts and background loops, the gRPC
server and the HTTP probes. docs/endpoint-picker.md shows it behind Envoy."""
