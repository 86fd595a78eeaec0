"""The Redis key schema: the only Python module that builds a key name, and the names of the
job record's fields (:class:`JobField`).

Every key of a tubeq namespace starts with ``{<prefix>}:``. The braces are a Redis Cluster hash
tag, so every key of a namespace lives in one slot and every script touches one slot: a reserve
that picks across several watched tubes needs that (beanstalkd orders by (pri, id) across all of
them). Scripts build the same names from the namespace root they receive as ``KEYS[1]``; their
copy of this schema is ``lua/includes/keys.lua`` and ``tests/store/test_lua.py`` keeps them equal.

A job is one hash, ``Keys.job(id)``; its fields are documented in ``lua/includes/job_record.lua``
(name, meaning, encoding, writers), the scripts name them by its ``JOB_*`` constants, and
:class:`JobField` mirrors them for Python's reads (``tests/store/test_lua.py`` keeps the two equal).

The schema's version is :data:`LAYOUT_VERSION`, recorded in each namespace (``Keys.layout``).

Tube names cannot contain ``{``, ``}`` or ``:`` (beanstalkd's alphabet is ``A-Za-z0-9-+/;.$_()``),
so a tube name can never break out of its place in a key.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# The version of the data layout this build reads and writes: the key names, what each key
# holds and what its members mean. It is recorded per namespace (``Keys.layout``, checked at
# start by tubeq.store.layout.claim_layout_version) and moves whenever a build writes something an
# older build would misread; the package version (tubeq.__version__) is not the same number.
#   1  0.1.0 as first released (772843d): jobs, tubes, pauses ('p:<tube>') and delayed jobs
#      ('d:<tube>') in {p}:timers, connections, waiters, instances, counters. No layout record.
#   2  0.2.0, the first build to record its layout. Adds the reserve limits (tube fields
#      lim/rw/rn; the rate window's end 'l:<tube>' in {p}:timers), job policies and deduplicated
#      put (put-with: {p}:ttl with its timer 'x:' in {p}:timers, {p}:dedupe, job fields),
#      tube settings ({p}:s:<tube>), recurring schedules ({p}:schedules, {p}:sc:...), the
#      lifecycle event stream ({p}:events), shards ({p}:shards, shard roots {p#k/n}:, job field
#      'cu') and the record itself ({p}:layout). A layout-1 build reads 'l:<tube>' as a pause
#      that ended and 'x:' as the pause of a tube named "" (it removes that timer: the TTL
#      jobs already put never expire), and ignores rate limits: a layout-1 build and a
#      layout-2 build must not serve one namespace together. Later builds that still called
#      themselves 0.1.0 wrote some or all of layout 2 without recording it.
#   3  0.3.0. Adds the namespace's jobs by state, kept as jobs move ({p}:counts, one per shard root;
#      lua/includes/jobs.lua), so stats, --max-jobs and the scrapes read no tube list. A
#      layout-2 build does not keep them: it and a layout-3 build must not serve one namespace
#      together. Taking over an older namespace counts them once (recount.lua).
#   4  Adds job dependencies (put-with after=): the state 'held' (job field 'ad', {p}:af:<id>,
#      {p}:ch:<id>, {p}:t:<tube>:h, tube fields nheld/npf, counts field 'h') and the parents'
#      ends on their way to children ({p}:parent_ends). A layout-3 build would take a held job
#      for a living one it cannot move (reserve-job would run it before its parents) and never
#      tell a child its parents ended: it must not serve a layout-4 namespace.
#   5  Adds groups inside a tube (put-with group=, lua/includes/groups.lua): job fields 'g'/'gk',
#      tube fields grp/gturn, {p}:t:<tube>:g:<group>:r, :gt, :gp, :gc, :gw. A layout-4 build
#      moves a grouped job into and out of ready without its group's set and turn: the tube's
#      index entry then names a job no longer ready (or misses one), so it must not serve a
#      layout-5 namespace.
#   6  Waiting connections in lines by watch set (lua/includes/waiter_counts.lua): {p}:t:<tube>:q
#      holds lines instead of tokens, {p}:waiting a mode and a line per token, new {p}:lines,
#      {p}:l:<line>, {p}:l:<line>:t; the per-tube waiter counts ('q:<tube>' in {p}:refs and the
#      instances' hashes) are no longer kept. Waits last as long as their connections, so a
#      layout-5 namespace is read as it is (what its waits left is passed over, first_line); but
#      a layout-5 build and a layout-6 build would not see each other's waiters (no hand-over,
#      no wake-up between them): they must not serve one namespace together.
LAYOUT_VERSION = 6
# The oldest recorded layout this build takes over in place: everything layouts 2 and 3 added is
# new keys, members and fields, so layout-1 data is valid layout-3 data once recount.lua has
# counted its jobs by state (tubeq.store.layout). A future layout that cannot read older data
# as it is moves this up (and ships a migration).
UPGRADES_IN_PLACE_FROM = 1
# The first layout that keeps the jobs by state ({p}:counts): a namespace recorded before it
# (or with no record) is recounted when a process takes it over.
COUNTS_SINCE_LAYOUT = 3


class JobField(StrEnum):
    """A field of a job's hash (``Keys.job``): ``JOB_<NAME>`` in ``lua/includes/job_record.lua``,
    where each is described."""

    TUBE = "t"
    STATE = "s"
    PRI = "p"
    DELAY = "d"
    TTR = "r"
    CREATED = "c"
    DUE = "u"
    BODY = "b"
    CREATED_US = "cu"
    SCHEDULE = "sn"
    TICK_DUE = "st"
    OWNER = "o"
    RESERVED_AT = "ra"
    READY_SINCE = "a"
    RESERVES = "nr"
    TIMEOUTS = "nt"
    RELEASES = "nl"
    BURIES = "nb"
    KICKS = "nk"
    MAX_TRIES = "mt"
    BACKOFF = "bo"
    BACKOFF_MAX = "bx"
    ON_EXPIRE = "oe"
    DEDUPE_KEY = "k"
    EXPIRES_AT = "x"
    TRIES = "ny"
    BURIED_FOR = "why"
    WAITED = "w"
    WAITED_BY = "wb"
    FAILURES = "nf"
    ERROR = "er"
    CANCELLED = "cx"
    PROGRESS = "pg"
    PROGRESS_SEQ = "ps"
    AFTER_DELAY = "ad"
    RESULT_TTL = "rt"
    GROUP = "g"
    GROUP_COUNTED = "gk"
    TRACEPARENT = "tp"


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names of one namespace (``prefix``); several namespaces can share one Redis."""

    prefix: str = "tubeq"

    @property
    def root(self) -> str:
        """The namespace root, passed to every script as ``KEYS[1]``."""
        return "{" + self.prefix + "}:"

    @property
    def job_ids(self) -> str:
        return self.root + "id"

    @property
    def shards(self) -> str:
        """How many shards the namespace is split into (tubeq.store.shards), set by its first
        process; on the unsplit root whatever the number."""
        return self.root + "shards"

    @property
    def layout(self) -> str:
        """The namespace's data layout version (LAYOUT_VERSION), written by its first process
        of a build that records it; on the namespace root only, whatever the shards."""
        return self.root + "layout"

    def job(self, job_id: int) -> str:
        return f"{self.root}j:{job_id}"

    def tube(self, tube: str) -> str:
        return f"{self.root}t:{tube}"

    def settings(self, tube: str) -> str:
        """A tube's settings (tube-set): kept when the tube itself goes, so they apply again."""
        return f"{self.root}s:{tube}"

    def ready(self, tube: str) -> str:
        return f"{self.root}t:{tube}:r"

    def delayed(self, tube: str) -> str:
        return f"{self.root}t:{tube}:d"

    def buried(self, tube: str) -> str:
        return f"{self.root}t:{tube}:b"

    # -- groups of a tube (put-with group=, lua/includes/groups.lua) ----------------------------

    def group_ready(self, tube: str, group: str) -> str:
        """A group's ready jobs, scored by priority (the tube's ready set holds them too)."""
        return f"{self.root}t:{tube}:g:{group}:r"

    def group_turns(self, tube: str) -> str:
        """The groups a reserve may serve, in serving order (score: the group's best priority)."""
        return f"{self.root}t:{tube}:gt"

    def group_places(self, tube: str) -> str:
        """Every group with ready jobs -> its turn number."""
        return f"{self.root}t:{tube}:gp"

    def group_reserved(self, tube: str) -> str:
        """Group -> its reserved jobs, counted while the tube has group limits."""
        return f"{self.root}t:{tube}:gc"

    def group_windows(self, tube: str) -> str:
        """Group -> '<window> <reserves granted in it>' (tube-set group-rate)."""
        return f"{self.root}t:{tube}:gw"

    @property
    def tubes(self) -> str:
        return self.root + "tubes"

    @property
    def ready_tubes(self) -> str:
        return self.root + "ready_tubes"

    @property
    def timers(self) -> str:
        return self.root + "timers"

    @property
    def reserved(self) -> str:
        return self.root + "reserved"

    @property
    def stats(self) -> str:
        return self.root + "stats"

    @property
    def counts(self) -> str:
        """The namespace's (or shard's) jobs by state, kept as jobs move (lua/includes/jobs.lua):
        whole-namespace figures read it instead of every tube."""
        return self.root + "counts"

    @property
    def events(self) -> str:
        """The lifecycle event stream (schema: tubeq.model.events)."""
        return self.root + "events"

    @property
    def seqs(self) -> str:
        """Sequence counters: tube creation order and bury order."""
        return self.root + "seq"

    @property
    def refs(self) -> str:
        return self.root + "refs"

    @property
    def instances(self) -> str:
        return self.root + "instances"

    @property
    def waiting(self) -> str:
        """token -> its mode and line (lua/includes/waiter_counts.lua) for every connection
        counted as waiting (makes counting out idempotent)."""
        return self.root + "waiting"

    def waiters(self, tube: str) -> str:
        """The lines (watch sets) with a connection waiting on a tube, each scored by at most
        the seq of its first waiter (lua/includes/waiter_counts.lua)."""
        return f"{self.root}t:{tube}:q"

    @property
    def line_of(self) -> str:
        """token -> the line of its watch set, as last computed (dropped when the set changes)."""
        return self.root + "lines"

    def line(self, line: str) -> str:
        """The tokens waiting in one line (one watch set), by the seq they started waiting at."""
        return f"{self.root}l:{line}"

    def line_tubes(self, line: str) -> str:
        """The tubes a line with waiters was entered in (its watch set)."""
        return f"{self.root}l:{line}:t"

    def blocked(self, token: str) -> str:
        """The number of the connection's last reserve whose first try found nothing
        (reserve.lua), read by the commands pipelined right behind it (blocked_ahead in
        lua/includes/jobs.lua); it expires by itself (BLOCKED_TTL_MS there)."""
        return f"{self.root}c:{token}:b"

    def handed(self, token: str) -> str:
        """Jobs a put handed to a waiting connection that its process has not claimed yet."""
        return f"{self.root}c:{token}:g"

    def end(self, job_id: int) -> str:
        """How a job ended, kept for a while (lua/includes/ends.lua)."""
        return f"{self.root}e:{job_id}"

    @property
    def ended_channel(self) -> str:
        """Where a script tells every process that a job someone waits for ended (its id)."""
        return self.root + "ended"

    # -- dependencies (put-with after=, lua/includes/after.lua) ---------------------------------

    def after(self, job_id: int) -> str:
        """A held job's parents that have not finished yet."""
        return f"{self.root}af:{job_id}"

    def children(self, job_id: int) -> str:
        """A living parent's children (ids, on any shard)."""
        return f"{self.root}ch:{job_id}"

    def held(self, tube: str) -> str:
        """A tube's held jobs, scored by id."""
        return f"{self.root}t:{tube}:h"

    @property
    def parent_ends(self) -> str:
        """Parents' ends not yet told to their children ('<child> <parent> <1|0>', by when),
        and the channel that says one was added."""
        return self.root + "parent_ends"

    @property
    def quiet_channel(self) -> str:
        """Where quiet.lua asks every process to quiet push consumers ('all', 'tube <name>',
        'conn <token>')."""
        return self.root + "quiet"

    def grant_channel(self, instance_id: str) -> str:
        """Where put.lua tells a process that one of its waiting connections got a job."""
        return f"{self.root}grant:{instance_id}"

    def cancels_channel(self, instance_id: str) -> str:
        """Where cancel.lua tells a process that a job one of its connections holds was
        cancelled ('<token> <id>')."""
        return f"{self.root}cancels:{instance_id}"

    def instance(self, instance_id: str) -> str:
        return f"{self.root}i:{instance_id}"

    def instance_conns(self, instance_id: str) -> str:
        return f"{self.root}i:{instance_id}:conns"

    def watch(self, token: str) -> str:
        return f"{self.root}c:{token}:w"

    def wake_channel(self, tube: str) -> str:
        return f"{self.root}wake:{tube}"

    @property
    def wake_pattern(self) -> str:
        return self.root + "wake:*"

    # -- job policies and deduplicated put (lua/includes/policies.lua) ---------------------------

    @property
    def ttl(self) -> str:
        """Jobs with a time to live, scored by the instant they expire (ms)."""
        return self.root + "ttl"

    @property
    def dedupe(self) -> str:
        """Dedupe key -> id of the living job put with it (put-with key=...)."""
        return self.root + "dedupe"
    # -- recurring jobs and reserve limits ---------------------------------------------------

    @property
    def schedules(self) -> str:
        """Every recurring schedule, member ``<tube>:<name>``, score = its next due time (ms)."""
        return self.root + "schedules"

    def schedule(self, tube: str, name: str) -> str:
        """One schedule's definition and progress (a hash)."""
        return f"{self.root}sc:{tube}:{name}"

    def schedule_names(self, tube: str) -> str:
        """The names of a tube's schedules (a set); they outlive the tube, like its settings."""
        return f"{self.root}sc:{tube}"

    @property
    def due_channel(self) -> str:
        """Where a script tells every process's scheduler of a due instant (ms) it created."""
        return self.root + "due"
