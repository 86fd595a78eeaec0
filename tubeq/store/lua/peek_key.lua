--[[ peek_key: the living job put with a dedupe key (put-with key=...), without changing anything.
KEYS[1]  namespace root
ARGV     key
Returns  {id, body} | {} when no living job has that key
]]
--- @include "keys"
local id = redis.call('HGET', K_DEDUPE, ARGV[1])
if not id then return {} end
local body = redis.call('HGET', k_job(id), JOB_BODY)
if not body then return {} end
return {tonumber(id), body}
