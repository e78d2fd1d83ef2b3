"""The HTTP handlers, one module per resource of docs/http-api.md; ``gateway/server/app.py`` holds
the route table that maps paths to them."""
