"""The adaptive concurrency limit toward one IdP: the rule (:mod:`.vegas`), the slots
and their priorities (:mod:`.slots`), and the layer (:mod:`.layer`).

Each replica holds its own limit (there is no shared store): every replica measures the
same IdP's latency, and in fleet mode each aims at its share of the IdP's queue
(docs/decisions.md, "Adaptive concurrency limit").
"""
