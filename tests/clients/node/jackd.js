// The scenario of tests/clients/README.md, driven through jackd (promise API, raw YAML stats).
// Usage: node jackd.js HOST PORT TUBE
'use strict';

const Jackd = require('jackd');
const {
  parseArgs, fail, expectEqual, expectFields, expectReply, runScenario, parseFlatYaml,
} = require('./checks');

const { host, port, tube } = parseArgs('jackd');
const server = `${host}:${port}`;

async function expectJob(what, promise, id, body) {
  const job = await promise;
  expectEqual(`${what} id`, job.id, id);
  expectEqual(`${what} body`, job.payload.toString(), body);
  return `job ${job.id} ${JSON.stringify(job.payload.toString())}`;
}

// jackd 2.2.2 writes `pause-tube TUBE DELAY` without its closing \r\n, so no server can answer
// it. The method writes its line synchronously before its first await, so the missing \r\n
// written right after it lands directly behind the command.
function pauseTube(client, name, delay) {
  const reply = client.pauseTube(name, { delay });
  client.socket.write('\r\n');
  return reply;
}

runScenario('jackd', server, async (step) => {
  const client = new Jackd();
  await client.connect({ host, port });
  client.socket.on('error', (error) => {
    process.stderr.write(`FAIL connection to ${server}: ${error.message}\n`);
    process.exit(1);
  });
  let a;
  let b;
  const statsJob = async (id) => parseFlatYaml(await client.statsJob(id));
  const statsTube = async () => parseFlatYaml(await client.statsTube(tube));

  await step('use', async () => {
    const used = await client.use(tube);
    expectEqual('use', used, tube);
    return `USING ${used}`;
  });
  await step('watch', async () => {
    const count = await client.watch(tube);
    expectEqual('watch count', count, 2);
    return `WATCHING ${count}`;
  });
  await step('ignore', async () => {
    const count = await client.ignore('default');
    expectEqual('ignore count', count, 1);
    return `WATCHING ${count}`;
  });
  await step('watched', async () => {
    const watched = parseFlatYaml(await client.listTubesWatched());
    expectEqual('list-tubes-watched', JSON.stringify(watched), JSON.stringify([tube]));
    const used = await client.listTubeUsed();
    expectEqual('list-tube-used', used, tube);
    return `watching ${JSON.stringify(watched)}, using ${used}`;
  });
  await step('put', async () => {
    a = await client.put('alpha', { priority: 100, delay: 0, ttr: 30 });
    b = await client.put('bravo', { priority: 200, delay: 30, ttr: 30 });
    if (!/^\d+$/.test(a) || !/^\d+$/.test(b) || a === b) {
      fail(`expected two different numeric ids, got ${JSON.stringify([a, b])}`);
    }
    return `A=${a} (pri 100), B=${b} (pri 200, delay 30)`;
  });
  await step('peek', () => expectJob('peek A', client.peek(a), a, 'alpha'));
  await step('peek-ready', () => expectJob('peek-ready', client.peekReady(), a, 'alpha'));
  await step('peek-delayed', () => expectJob('peek-delayed', client.peekDelayed(), b, 'bravo'));
  await step('stats-tube', async () => {
    expectFields('stats-tube', await statsTube(), {
      name: tube, 'current-jobs-ready': 1, 'current-jobs-delayed': 1, 'total-jobs': 2,
    });
    return 'ready 1, delayed 1, total-jobs 2';
  });
  await step('stats-job-delayed', async () => {
    expectFields('stats-job B', await statsJob(b),
      { state: 'delayed', pri: 200, delay: 30, tube });
    return `B delayed, pri 200, delay 30, tube ${tube}`;
  });
  await step('reserve', () => expectJob('reserve', client.reserveWithTimeout(5), a, 'alpha'));
  await step('stats-job', async () => {
    expectFields('stats-job A', await statsJob(a), {
      id: a, state: 'reserved', pri: 100, ttr: 30, reserves: 1, tube,
    });
    return 'A reserved, pri 100, ttr 30, reserves 1';
  });
  await step('touch', async () => {
    await client.touch(a);
    return 'TOUCHED';
  });
  await step('kick-job', async () => {
    await client.kickJob(b);
    expectFields('stats-job B', await statsJob(b), { state: 'ready' });
    return 'KICKED, B ready';
  });
  await step('reserve-second',
    () => expectJob('reserve', client.reserveWithTimeout(5), b, 'bravo'));
  await step('bury', async () => {
    await client.bury(b, 60);
    expectFields('stats-job B', await statsJob(b), { state: 'buried', pri: 60, buries: 1 });
    return 'BURIED, pri 60, buries 1';
  });
  await step('peek-buried', () => expectJob('peek-buried', client.peekBuried(), b, 'bravo'));
  await step('release', async () => {
    await client.release(a, { priority: 50, delay: 1 });
    return 'RELEASED with pri 50, delay 1';
  });
  await step('reserve-after-delay',
    () => expectJob('reserve', client.reserveWithTimeout(5), a, 'alpha'));
  await step('stats-job-released', async () => {
    expectFields('stats-job A', await statsJob(a),
      { state: 'reserved', pri: 50, releases: 1, reserves: 2 });
    return 'A pri 50, releases 1, reserves 2';
  });
  await step('delete', async () => {
    await client.delete(a);
    await expectReply('peek deleted A', client.peek(a), 'NOT_FOUND');
    await expectReply('stats-job deleted A', client.statsJob(a), 'NOT_FOUND');
    return 'DELETED, then NOT_FOUND for peek and stats-job';
  });
  await step('kick', async () => {
    const kicked = await client.kick(10);
    expectEqual('kick count', kicked, 1);
    expectFields('stats-job B', await statsJob(b), { state: 'ready', kicks: 2 });
    await expectJob('peek-ready', client.peekReady(), b, 'bravo');
    return 'KICKED 1, B ready, kicks 2';
  });
  await step('pause-tube', async () => {
    await pauseTube(client, tube, 30);
    expectFields('stats-tube', await statsTube(), { pause: 30, 'current-jobs-ready': 1 });
    await expectReply('reserve on a paused tube', client.reserveWithTimeout(0), 'TIMED_OUT');
    return 'PAUSED, pause 30, reserve TIMED_OUT';
  });
  await step('unpause', async () => {
    await pauseTube(client, tube, 0);
    await expectJob('reserve', client.reserveWithTimeout(5), b, 'bravo');
    await client.delete(b);
    return 'PAUSED 0, reserved and deleted B';
  });
  await step('list-tubes', async () => {
    const tubes = parseFlatYaml(await client.listTubes());
    if (!Array.isArray(tubes) || !tubes.includes(tube)) {
      fail(`list-tubes: expected a list containing ${tube}, got ${JSON.stringify(tubes)}`);
    }
    return `${tubes.length} tubes, ${tube} among them`;
  });
  await step('stats-tube-final', async () => {
    expectFields('stats-tube', await statsTube(), {
      'current-jobs-ready': 0, 'current-jobs-reserved': 0, 'current-jobs-delayed': 0,
      'current-jobs-buried': 0, 'total-jobs': 2, 'cmd-delete': 2, 'cmd-pause-tube': 2, pause: 0,
    });
    return 'empty, total-jobs 2, cmd-delete 2, cmd-pause-tube 2, pause 0';
  });
  await step('timed-out', async () => {
    await expectReply('reserve-with-timeout 0', client.reserveWithTimeout(0), 'TIMED_OUT');
    return 'TIMED_OUT';
  });
  await client.quit();
});
