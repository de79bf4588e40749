"""Contracts every part of memstream agrees on: events, trace units, ports (store interfaces),
query requests/responses and errors. Depends on nothing else in memstream."""
