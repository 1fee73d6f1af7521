"""The HTTP/1.1 connection as a hostile client meets it.

uvicorn's httptools protocol, plus what a port reachable by anyone needs:

- **bounds in number and time**: at most ``max_connections`` open (more are closed at
  once and counted); a head must be complete within ``header_timeout`` and a body
  within ``body_timeout`` of its head; a TLS handshake within ``header_timeout``;
- **bounds in bytes per request**: the request line plus headers, counted per
  request (pipelined requests each get the whole limit), and an unfinished head
  costs at most ``max_header_bytes`` plus one read slice of parser buffer;
- **a bound per connection, whatever it sends**: reads of 4 KiB, at most two requests
  parsed and unanswered, nothing more read while they wait or their answers wait
  unsent, and answers unsent for ``send_timeout`` end the connection (``intake``);
- **half-close**: a client that half-closes after its requests gets their answers;
- **no 500**: an exception of ours while answering is reported (logged once per kind,
  counted) and answered per the answer rules, and the connection keeps its timers;
- **lingering close**: when the gateway ends a connection (an answer before the body
  was read, ``Connection: close``, a drain) it sends its answer, half-closes, and reads
  and discards what the client still sends for a bounded time and amount, the way
  nginx does, so the client reads the answer instead of a reset;
- **no trailers, no upgrades**: chunked trailers never reach the headers, and
  ``Upgrade`` (h2c, websocket) is ignored, the body read as for any request;
- **graceful drain**: on shutdown every connection gets the answer to its current or
  next request with ``Connection: close``; idle ones wait ``drain_idle_seconds`` for
  one, then close cleanly;
- **answers at once**: a request that arrives whole (head and body in one read) with
  nothing before it on the connection is offered to ``answer_at_once`` (the review
  endpoint's cache-hit path) before any task is made for it; what that does not
  answer goes through ASGI as usual;
- **writes batched per turn of the loop**: what a connection writes is held until the
  loop has run every read that was ready, then sent in order, one ``send()`` per
  connection; closing, half-closing or aborting sends (or drops) what is held first;
- **TLS done here**: the handshake runs in asyncio's ``SSLProtocol`` with whichever server
  context is current (so certificate *and* client CA reloads apply to new
  connections), and its failures are counted by reason and logged, rate-limited.

Modules: ``protocol`` (reading and parsing: ``GatewayHttpProtocol``), ``connection``
(its life below that: ``EdgeConnection``), ``intake`` (the read bound), ``limits`` (one
listener's ``EdgeLimits`` and ``EdgeStats``), ``cycle`` (what a request's ASGI cycle
sees of the connection), ``answers`` (what the protocol writes itself), ``batching``
(writes held to the end of the loop's turn), ``handshake``
(TLS handshake failures by reason), ``ratelog`` (rate-limited warnings) and
``metrics`` (the counts, exported at scrape time).

See docs/decisions.md ("The HTTP edge: uvicorn, extended") for why this extends
uvicorn instead of replacing it.
"""

from authn_gateway.edge.limits import EdgeLimits, EdgeStats
from authn_gateway.edge.protocol import GatewayHttpProtocol

__all__ = ["EdgeLimits", "EdgeStats", "GatewayHttpProtocol"]
