--[[ layout: record the namespace's data layout version, or take the record over from an older
layout this build reads as it is. Run once by each process at start, before anything else it
does in the namespace (tubeq.durability.claim_layout_version); one script, so two processes
starting at once cannot both read "none" or an older version and then write over a newer one.
KEYS[1]  namespace root (the unsplit root also for a namespace split into shards)
ARGV     this build's layout version, the oldest recorded version it may take over in place
Returns  {recorded before ('' if none), recorded now}: a recorded version newer than this
         build's, older than the oldest it takes over, or unreadable is left as it was
Events   none
]]
--- @include "keys"
local mine, oldest = tonumber(ARGV[1]), tonumber(ARGV[2])
local recorded = redis.call('GET', K_LAYOUT)
if not recorded then
  redis.call('SET', K_LAYOUT, mine)
  return {'', tostring(mine)}
end
local version = string.match(recorded, '^%d+$') and tonumber(recorded)
if version and version >= oldest and version < mine then
  redis.call('SET', K_LAYOUT, mine)
  return {recorded, tostring(mine)}
end
return {recorded, recorded}
