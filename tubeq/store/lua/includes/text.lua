-- Numbers as the text Redis stores. A Lua number handed to redis.call is turned into text by
-- Redis 7.0 with snprintf('%.17g'), and Lua's own tostring and `..` use '%.14g': each ~0.6-1 us
-- on the hosts we measure (bench/PROFILE_NOTES.md), and a hot script's job passes ~10 of them
-- (ids, times, deadlines, counts). text(n) gives the same digits ('%d': an integer below 2^53
-- has no other text), each number formatted once and then looked up: `now`, the zeros and a
-- batch's repeated values cost one lookup. The table is kept across calls where the script is a
-- library function, so it is emptied when it reaches TEXT_CACHE_MAX entries. A string passes
-- through as it is; a fraction or a number past 2^53 goes to Redis as a number.
-- The other way, a hot script reads a stored number by arithmetic on its text ('ttr + 0'), which
-- parses the digits once, where tonumber() parses them twice (lua_isnumber, then lua_tonumber).
local TEXT_CACHE_MAX = 4096
local texts, texts_n = {[0] = '0', [1] = '1'}, 2
local function text(n)
  if type(n) ~= 'number' then return n end
  local s = texts[n]
  if s then return s end
  if n % 1 ~= 0 or n >= 9007199254740992 or n <= -9007199254740992 then return n end
  if texts_n >= TEXT_CACHE_MAX then texts, texts_n = {[0] = '0', [1] = '1'}, 2 end
  s = string.format('%d', n)
  texts[n], texts_n = s, texts_n + 1
  return s
end
