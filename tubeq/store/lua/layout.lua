--[[ layout: record the namespace's data layout version, or take the record over from an older
layout this build reads as it is. Run once by each process at start, before anything else it
does in the namespace (tubeq.store.layout.claim_layout_version); one script, so two processes
starting at once cannot both read "none" or an older version and then write over a newer one.
KEYS[1]  namespace root (the unsplit root also for a namespace split into shards)
ARGV     this build's layout version, the oldest recorded version it may take over in place
Returns  {recorded before ('' if none), recorded now}: a recorded version newer than this
         build's, older than the oldest it takes over, or unreadable is left as it was, and
         nothing else is done
Also     re-arms the TTL sweep's timer 'x:' from the head of K_TTL: a layout-1 process (0.1.0
         as first released) takes that timer for a pause and removes it when it fires, after
         which the jobs put with a TTL before never expire (only on this root: a layout-1
         process knows no shards, so it never fires a shard root's timers)
Events   none
]]
--- @include "keys"
--- @include "jobs"
--- @include "policies"
local mine, oldest = tonumber(ARGV[1]), tonumber(ARGV[2])
local recorded = rcall('GET', K_LAYOUT)
local version = recorded and string.match(recorded, '^%d+$') and tonumber(recorded)
if recorded and not (version and version >= oldest and version <= mine) then
  return {recorded, recorded}
end
if version ~= mine then rcall('SET', K_LAYOUT, mine) end
arm_ttl_timer()
return {recorded or '', tostring(mine)}
