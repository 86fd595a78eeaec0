// The scenario of tests/clients/README.md, driven through fivebeans (callback API, js-yaml stats).
// Usage: node fivebeans.js HOST PORT TUBE
'use strict';

const fivebeans = require('fivebeans');
const {
  parseArgs, fail, expectEqual, expectFields, expectReply, runScenario,
} = require('./checks');

const { host, port, tube } = parseArgs('fivebeans');
const server = `${host}:${port}`;

// fivebeans calls back with (error, ...values); its error is the bare reply word (e.g. NOT_FOUND).
function call(client, method, ...args) {
  return new Promise((resolve, reject) => {
    client[method](...args, (error, ...values) => (error ? reject(error) : resolve(values)));
  });
}

function connect() {
  const client = new fivebeans.client(host, port);
  return new Promise((resolve, reject) => {
    client.once('connect', () => {
      // From here on a transport error can only be reported: it ends the scenario.
      client.removeAllListeners('error');
      client.on('error', (error) => {
        process.stderr.write(`FAIL connection to ${server}: ${error.message}\n`);
        process.exit(1);
      });
      resolve(client);
    });
    client.once('error', (error) => reject(error));
    client.connect();
  });
}

async function expectJob(what, promise, id, body) {
  const [gotId, payload] = await promise;
  expectEqual(`${what} id`, gotId, id);
  expectEqual(`${what} body`, payload.toString(), body);
  return `job ${gotId} ${JSON.stringify(payload.toString())}`;
}

runScenario('fivebeans', server, async (step) => {
  const client = await connect();
  let a;
  let b;

  await step('use', async () => {
    const [used] = await call(client, 'use', tube);
    expectEqual('use', used, tube);
    return `USING ${used}`;
  });
  await step('watch', async () => {
    const [count] = await call(client, 'watch', tube);
    expectEqual('watch count', count, 2);
    return `WATCHING ${count}`;
  });
  await step('ignore', async () => {
    const [count] = await call(client, 'ignore', 'default');
    expectEqual('ignore count', count, 1);
    return `WATCHING ${count}`;
  });
  await step('watched', async () => {
    const [watched] = await call(client, 'list_tubes_watched');
    expectEqual('list-tubes-watched', JSON.stringify(watched), JSON.stringify([tube]));
    const [used] = await call(client, 'list_tube_used');
    expectEqual('list-tube-used', used, tube);
    return `watching ${JSON.stringify(watched)}, using ${used}`;
  });
  await step('put', async () => {
    [a] = await call(client, 'put', 100, 0, 30, 'alpha');
    [b] = await call(client, 'put', 200, 30, 30, 'bravo');
    if (!/^\d+$/.test(a) || !/^\d+$/.test(b) || a === b) {
      fail(`expected two different numeric ids, got ${JSON.stringify([a, b])}`);
    }
    return `A=${a} (pri 100), B=${b} (pri 200, delay 30)`;
  });
  await step('peek', () => expectJob('peek A', call(client, 'peek', a), a, 'alpha'));
  await step('peek-ready', () => expectJob('peek-ready', call(client, 'peek_ready'), a, 'alpha'));
  await step('peek-delayed',
    () => expectJob('peek-delayed', call(client, 'peek_delayed'), b, 'bravo'));
  await step('stats-tube', async () => {
    const [stats] = await call(client, 'stats_tube', tube);
    expectFields('stats-tube', stats, {
      name: tube, 'current-jobs-ready': 1, 'current-jobs-delayed': 1, 'total-jobs': 2,
    });
    return 'ready 1, delayed 1, total-jobs 2';
  });
  await step('stats-job-delayed', async () => {
    const [stats] = await call(client, 'stats_job', b);
    expectFields('stats-job B', stats, { state: 'delayed', pri: 200, delay: 30, tube });
    return `B delayed, pri 200, delay 30, tube ${tube}`;
  });
  await step('reserve', () => expectJob('reserve', call(client, 'reserve_with_timeout', 5), a,
    'alpha'));
  await step('stats-job', async () => {
    const [stats] = await call(client, 'stats_job', a);
    expectFields('stats-job A', stats, {
      id: a, state: 'reserved', pri: 100, ttr: 30, reserves: 1, tube,
    });
    return 'A reserved, pri 100, ttr 30, reserves 1';
  });
  await step('touch', async () => {
    await call(client, 'touch', a);
    return 'TOUCHED';
  });
  await step('kick-job', async () => {
    await call(client, 'kick_job', b);
    const [stats] = await call(client, 'stats_job', b);
    expectFields('stats-job B', stats, { state: 'ready' });
    return 'KICKED, B ready';
  });
  await step('reserve-second', () => expectJob('reserve', call(client, 'reserve_with_timeout', 5),
    b, 'bravo'));
  await step('bury', async () => {
    await call(client, 'bury', b, 60);
    const [stats] = await call(client, 'stats_job', b);
    expectFields('stats-job B', stats, { state: 'buried', pri: 60, buries: 1 });
    return 'BURIED, pri 60, buries 1';
  });
  await step('peek-buried', () => expectJob('peek-buried', call(client, 'peek_buried'), b,
    'bravo'));
  await step('release', async () => {
    await call(client, 'release', a, 50, 1);
    return 'RELEASED with pri 50, delay 1';
  });
  await step('reserve-after-delay', () => expectJob('reserve',
    call(client, 'reserve_with_timeout', 5), a, 'alpha'));
  await step('stats-job-released', async () => {
    const [stats] = await call(client, 'stats_job', a);
    expectFields('stats-job A', stats, { state: 'reserved', pri: 50, releases: 1, reserves: 2 });
    return 'A pri 50, releases 1, reserves 2';
  });
  await step('delete', async () => {
    await call(client, 'destroy', a);
    await expectReply('peek deleted A', call(client, 'peek', a), 'NOT_FOUND');
    await expectReply('stats-job deleted A', call(client, 'stats_job', a), 'NOT_FOUND');
    return 'DELETED, then NOT_FOUND for peek and stats-job';
  });
  await step('kick', async () => {
    const [kicked] = await call(client, 'kick', 10);
    expectEqual('kick count', kicked, 1);
    const [stats] = await call(client, 'stats_job', b);
    expectFields('stats-job B', stats, { state: 'ready', kicks: 2 });
    await expectJob('peek-ready', call(client, 'peek_ready'), b, 'bravo');
    return 'KICKED 1, B ready, kicks 2';
  });
  await step('pause-tube', async () => {
    await call(client, 'pause_tube', tube, 30);
    const [stats] = await call(client, 'stats_tube', tube);
    expectFields('stats-tube', stats, { pause: 30, 'current-jobs-ready': 1 });
    await expectReply('reserve on a paused tube', call(client, 'reserve_with_timeout', 0),
      'TIMED_OUT');
    return 'PAUSED, pause 30, reserve TIMED_OUT';
  });
  await step('unpause', async () => {
    await call(client, 'pause_tube', tube, 0);
    await expectJob('reserve', call(client, 'reserve_with_timeout', 5), b, 'bravo');
    await call(client, 'destroy', b);
    return 'PAUSED 0, reserved and deleted B';
  });
  await step('list-tubes', async () => {
    const [tubes] = await call(client, 'list_tubes');
    if (!Array.isArray(tubes) || !tubes.includes(tube)) {
      fail(`list-tubes: expected a list containing ${tube}, got ${JSON.stringify(tubes)}`);
    }
    return `${tubes.length} tubes, ${tube} among them`;
  });
  await step('stats-tube-final', async () => {
    const [stats] = await call(client, 'stats_tube', tube);
    expectFields('stats-tube', stats, {
      'current-jobs-ready': 0, 'current-jobs-reserved': 0, 'current-jobs-delayed': 0,
      'current-jobs-buried': 0, 'total-jobs': 2, 'cmd-delete': 2, 'cmd-pause-tube': 2, pause: 0,
    });
    return 'empty, total-jobs 2, cmd-delete 2, cmd-pause-tube 2, pause 0';
  });
  await step('timed-out', async () => {
    await expectReply('reserve-with-timeout 0', call(client, 'reserve_with_timeout', 0),
      'TIMED_OUT');
    return 'TIMED_OUT';
  });
  client.end();
});
