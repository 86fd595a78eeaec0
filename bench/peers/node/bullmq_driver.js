// BullMQ driver of the peers benchmark (bench/peers): the same contract as the Python drivers
// (bench/peers/common.py). Arguments: ROLE --url redis://... --single M --batched N --chunk C
// --concurrency K --time-limit S --out FILE; writes one JSON object to FILE.
//
// produce: Queue.add (each awaited), then Queue.addBulk of C jobs at a time; every job with
// removeOnComplete and removeOnFail (BullMQ keeps no finished job). consume: one Worker with
// concurrency K and a processor that only returns. Times are process.hrtime (CLOCK_MONOTONIC on
// Linux, the clock of Python's time.monotonic()); CPU is process.cpuUsage() (all threads).
//
// Request/reply (bench.peers.call, the contract of bench/peers/call_common.py): ROLE serve or
// call, --single M --parallel N --callers K --concurrency C --warmup W --phase-limit S
// --time-limit S. serve: one Worker with concurrency C whose processor returns the payload
// upper-cased (BullMQ keeps completed jobs and their return values by default). call:
// Queue.add then job.waitUntilFinished(queueEvents, ttl), BullMQ's own request/reply; the K
// callers are K async loops of this one process sharing one Queue and one QueueEvents (both
// multiplex; BullMQ needs no connection per caller).
'use strict';

const fs = require('fs');
const { Queue, QueueEvents, Worker } = require('bullmq');

const QUEUE = 'peers';
const EMPTY_POLL_MS = 5;
const JOB_OPTS = { removeOnComplete: true, removeOnFail: true };

function parse(argv) {
  const args = { role: argv[0], chunk: 1000, concurrency: 32 };
  for (let i = 1; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '').replace(/-/g, '_');
    args[key] = argv[i + 1];
  }
  for (const key of ['single', 'batched', 'chunk', 'concurrency', 'time_limit', 'parallel',
    'callers', 'warmup', 'phase_limit']) {
    if (args[key] !== undefined) args[key] = Number(args[key]);
  }
  return args;
}

const now = () => Number(process.hrtime.bigint()) / 1e9;
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function connection(url) {
  const u = new URL(url);
  // maxRetriesPerRequest null: what BullMQ requires of a Worker's connection.
  return { host: u.hostname, port: Number(u.port), maxRetriesPerRequest: null };
}

async function phase(jobs, api, body) {
  const t0 = now(); const cpu0 = cpu();
  await body();
  const t1 = now();
  return { jobs, api, t0, t1, seconds: t1 - t0, cpu_s: cpu() - cpu0 };
}

async function produce(args) {
  const queue = new Queue(QUEUE, { connection: connection(args.url) });
  await queue.waitUntilReady();
  try {
    const single = await phase(args.single, 'add, awaited', async () => {
      for (let i = 0; i < args.single; i++) await queue.add('noop', {}, JOB_OPTS);
    });
    const batched = await phase(args.batched, `addBulk of ${args.chunk}`, async () => {
      for (let start = 0; start < args.batched; start += args.chunk) {
        const size = Math.min(args.chunk, args.batched - start);
        const jobs = [];
        for (let i = 0; i < size; i++) jobs.push({ name: 'noop', data: {}, opts: JOB_OPTS });
        await queue.addBulk(jobs);
      }
    });
    return { single, batched };
  } finally {
    await queue.close();
  }
}

async function consume(args) {
  const deadline = now() + args.time_limit;
  const target = args.single + args.batched;
  const tally = { count: 0, first_start: null, cpu_at_first: null, last_done: null, cpu_at_last: null };
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  const worker = new Worker(QUEUE, async () => {
    if (tally.first_start === null) { tally.cpu_at_first = cpu(); tally.first_start = now(); }
    tally.count += 1;
    if (tally.count === target) { tally.last_done = now(); tally.cpu_at_last = cpu(); finish(); }
  }, { connection: connection(args.url), concurrency: args.concurrency });
  const queue = new Queue(QUEUE, { connection: connection(args.url) });
  let failure = null;
  worker.on('error', (err) => { failure = failure || String(err); });
  try {
    const limit = sleep(Math.max(0, (deadline - now()) * 1000)).then(() => 'timeout');
    if (await Promise.race([finished.then(() => 'done'), limit]) !== 'done') {
      throw new Error(`time limit: ${tally.count} of ${target} jobs`);
    }
    const remaining = async () => {
      const counts = await queue.getJobCounts('wait', 'active', 'delayed', 'prioritized',
        'waiting-children', 'paused', 'completed', 'failed');
      return counts;
    };
    let counts = await remaining();
    const busy = (c) => Object.values(c).some((v) => v > 0);
    while (busy(counts) && now() < deadline) {
      await sleep(EMPTY_POLL_MS);
      counts = await remaining();
    }
    const emptyAt = busy(counts) ? null : now();
    if (failure) throw new Error(failure);
    return {
      jobs: tally.count, target, first_start: tally.first_start, last_done: tally.last_done,
      cpu_s: tally.cpu_at_last - tally.cpu_at_first, empty_at: emptyAt, remaining: counts,
    };
  } finally {
    await worker.close();
    await queue.close();
  }
}

// -- request/reply (bench.peers.call) ------------------------------------------------------------

const CALL_QUEUE = 'calls';
const CALL_TIMEOUT_MS = 30000; // call_common.CALL_TIMEOUT_S
const MAX_ERRORS = 20; // call_common.MAX_ERRORS
const payload = (caller, seq) =>
  `call ${String(caller).padStart(2, '0')} ${String(seq).padStart(6, '0')}`;

async function serve(args) {
  const worker = new Worker(CALL_QUEUE, async (job) => job.data.payload.toUpperCase(),
    { connection: connection(args.url), concurrency: args.concurrency });
  let failure = null;
  worker.on('error', (err) => { failure = failure || String(err); });
  try {
    // The orchestrator kills this process by PID long before.
    await sleep(args.time_limit * 1000);
    if (failure) throw new Error(failure);
    return { stopped: 'time limit' };
  } finally {
    await worker.close();
  }
}

// One phase: `target` calls (or `limitS` worth) by `callers` loops, each awaiting its call.
async function callPhase(name, target, callers, limitS, one) {
  const latencies = [];
  let started = 0; let errors = 0; let wrong = 0; let firstError = null; let stoppedBy = 'count';
  const t0 = now(); const cpu0 = cpu(); const deadline = t0 + limitS;
  const nextSeq = () => {
    if (started >= target) return null;
    if (errors >= MAX_ERRORS) { stoppedBy = 'errors'; return null; }
    if (now() >= deadline) { stoppedBy = 'time'; return null; }
    started += 1;
    return started - 1;
  };
  const caller = async (index) => {
    for (let seq = nextSeq(); seq !== null; seq = nextSeq()) {
      const request = payload(index, seq);
      const start = now();
      let answer;
      try {
        answer = await one(request);
      } catch (err) {
        errors += 1;
        firstError = firstError || String(err && err.message ? err.message : err).slice(0, 300);
        continue;
      }
      const end = now();
      if (answer !== request.toUpperCase()) {
        wrong += 1;
        firstError = firstError || `wrong answer ${JSON.stringify(answer)}`;
      } else {
        latencies.push(Math.round((end - start) * 1e6));
      }
    }
  };
  const loops = [];
  for (let i = 0; i < callers; i++) loops.push(caller(i));
  await Promise.all(loops);
  const t1 = now();
  return {
    phase: name, calls: latencies.length, target, callers, errors, wrong,
    first_error: firstError, stopped_by: stoppedBy, t0, t1, seconds: t1 - t0,
    cpu_s: cpu() - cpu0, latencies_us: latencies,
  };
}

async function call(args) {
  const queue = new Queue(CALL_QUEUE, { connection: connection(args.url) });
  const events = new QueueEvents(CALL_QUEUE, { connection: connection(args.url) });
  await queue.waitUntilReady();
  await events.waitUntilReady();
  const one = async (request) => {
    const job = await queue.add('echo', { payload: request });
    return job.waitUntilFinished(events, CALL_TIMEOUT_MS);
  };
  try {
    const warmup = await callPhase('warmup', args.warmup, args.callers, args.phase_limit, one);
    delete warmup.latencies_us;
    const single = await callPhase('single', args.single, 1, args.phase_limit, one);
    const parallel = await callPhase('parallel', args.parallel, args.callers, args.phase_limit,
      one);
    return { warmup, single, parallel };
  } finally {
    await events.close();
    await queue.close();
  }
}

const ROLES = { produce, consume, serve, call };

async function main() {
  const args = parse(process.argv.slice(2));
  let result;
  try {
    if (!ROLES[args.role]) throw new Error(`unknown role ${args.role}`);
    result = await ROLES[args.role](args);
  } catch (err) {
    console.error(err);
    result = { error: String(err && err.message ? err.message : err) };
  }
  fs.writeFileSync(args.out, JSON.stringify(result));
  process.exit(result.error ? 1 : 0);
}

main();
