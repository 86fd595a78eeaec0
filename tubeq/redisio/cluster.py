"""Redis Cluster: the ``redis+cluster://`` URL form, and which node serves each key.

Owns: parsing the seed list, and reading the cluster's slot map through redis-py's cluster
support (:class:`redis.asyncio.cluster.RedisCluster`: seeds, ``CLUSTER SLOTS``, coverage), not
a cluster client of tubeq's own. tubeq then keeps one pipelined connection
(:class:`tubeq.redisio.client.RedisClient`) per node it needs: the node of each shard's hash tag
(tubeq.store.shards) and of each namespace's root.

URL form::

    redis+cluster://[[user]:password@]host1:port1[,host2:port2,...][/]

Rules:

* The slot map is read once, at start. A cluster that is not in state ``ok`` or leaves slots
  unserved is refused with one line (:class:`ClusterUnavailable`), as an unreachable seed is.
* A node restart is a reconnect of that node's connection (its scripts are loaded again, its
  waiters re-check). A slot that moves to another node (resharding, a replica promoted) answers
  ``MOVED``/``ASK``, or its node is unreachable: the commands sent there fail (the client sees
  INTERNAL_ERROR, never a success that did not happen: a MOVED command did not run), and the
  server reads the map again within a second and moves the shard to its new node's connection
  (``Server._follow_cluster``, ``ShardedStore.rebind``). A namespace of one shard on a cluster
  does not follow (restart tubeq); use ``--shards`` >= 2 there (16 by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

SCHEME = "redis+cluster"
DEFAULT_PORT = 6379
# Bound on the connect and answer of each seed while the map is read.
CLUSTER_TIMEOUT_S = 5.0
SLOTS = 16384
# --shards on a cluster when not given: enough hash tags to spread over a few nodes evenly.
DEFAULT_CLUSTER_SHARDS = 16


class ClusterUnavailable(ConnectionError):
    """No usable slot map: unreachable seeds, a cluster not in state ok, unserved slots."""


def is_cluster_url(url: str) -> bool:
    return url.startswith(SCHEME + "://")


@dataclass(frozen=True)
class ClusterSeeds:
    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str) -> ClusterSeeds:
        if not is_cluster_url(url):
            raise ValueError(f"not a {SCHEME}:// url: {url!r}")
        rest = url[len(SCHEME) + 3:]
        auth, _, hosts = rest.rpartition("@")
        hosts = hosts.split("/", 1)[0]
        nodes: list[tuple[str, int]] = []
        for part in filter(None, hosts.split(",")):
            where = urlsplit("//" + part)
            if not where.hostname:
                raise ValueError(f"bad cluster seed {part!r} in {url!r}")
            nodes.append((where.hostname, where.port or DEFAULT_PORT))
        if not nodes:
            raise ValueError(f"no cluster seed in {url!r}: use {SCHEME}://host:port,...")
        user, _, secret = auth.partition(":") if auth else ("", "", "")
        return cls(tuple(nodes), unquote(user) or None,
                   unquote(secret) if auth and ":" in auth else None)

    def __str__(self) -> str:
        return f"{SCHEME}://" + ",".join(f"{host}:{port}" for host, port in self.nodes)

    def node_url(self, host: str, port: int) -> str:
        """A ``redis://`` URL for one node, with the seeds' credentials."""
        auth = ""
        if self.password is not None:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        return f"redis://{auth}{host}:{port}/0"


@dataclass(frozen=True)
class SlotMap:
    """Which node (its ``redis://`` URL) serves each of the 16384 slots."""

    owners: tuple[str, ...]

    def url_for(self, key: str) -> str:
        from redis.crc import key_slot  # see read_slot_map

        return self.owners[key_slot(key.encode())]


async def read_slot_map(seeds: ClusterSeeds) -> SlotMap:
    """The cluster's slot map, each slot's primary; :class:`ClusterUnavailable` if there is
    none to use."""
    # redis-py here, not at the top: importing it costs ~0.15 s of every start, and only a
    # cluster URL needs it.
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.exceptions import RedisClusterException, RedisError

    cluster = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in seeds.nodes],
        username=seeds.username, password=seeds.password, require_full_coverage=True,
        socket_connect_timeout=CLUSTER_TIMEOUT_S, socket_timeout=CLUSTER_TIMEOUT_S)
    try:
        await cluster.initialize()
        info = await cluster.cluster_info()
        state = info.get("cluster_state") if isinstance(info, dict) else None
        if state != "ok":
            raise ClusterUnavailable(f"cluster state is {state!r}, not 'ok' (slots unserved?)")
        cache = cluster.nodes_manager.slots_cache
        owners: list[str] = []
        for slot in range(SLOTS):
            nodes = cache.get(slot)
            if not nodes:
                raise ClusterUnavailable(f"slot {slot} is served by no node")
            owners.append(seeds.node_url(nodes[0].host, int(nodes[0].port)))
        return SlotMap(tuple(owners))
    except (RedisClusterException, RedisError, OSError) as error:
        raise ClusterUnavailable(f"{seeds}: {str(error) or type(error).__name__}") from None
    finally:
        await cluster.aclose()
