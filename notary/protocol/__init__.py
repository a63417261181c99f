"""The sans-IO protocol core: no Trio, no sockets, no clock reads.

Everything here turns bytes into events and values into bytes; time is always a
parameter. The I/O edges (``notary.server``, ``notary.outbound.probe``) drive it.
"""
