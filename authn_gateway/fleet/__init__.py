"""Fleet mode: the Redis link, the fleet's size, sealed values replicas share."""
