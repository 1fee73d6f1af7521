"""Operators' control over identities the gateway vouches for: eviction and a deny list.

``subject`` names who an action is about; ``denylist`` and ``eviction`` are the two
mechanisms over small storage interfaces, with the one-replica versions in
``memory`` and the fleet versions in ``redis``; ``bus`` carries actions to the other
replicas; ``actions`` is what the admin API calls.
"""
