--[[ quiet: ask every tubeq process of the namespace to quiet push consumers (stop taking
jobs; tubeq.server.process routes the message to ServerContext.quiet_consumers).
KEYS[1]  namespace root
ARGV     the scope: 'all', 'tube <name>' or 'conn <token>'
Returns  the number of subscribers that heard it (processes; in a Cluster, the node's only)
]]
--- @include "keys"
return redis.call('PUBLISH', K_QUIET, ARGV[1])
