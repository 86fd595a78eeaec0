"""tubeq.redisio against real redis-servers: the RESP client, pub/sub, Sentinel acknowledgement,
Redis Cluster, the start-up checks and the private redis-server."""
