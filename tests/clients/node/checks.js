// What the Node client scripts share: argument parsing, the step reporter with its watchdog, and a
// parser for the flat YAML beanstalkd sends (jackd hands it over as raw text).
//
// A scenario calls step(name, async () => detail) for every check; step prints `ok NAME: detail`.
// The first failure prints `FAIL NAME: message` on stderr and exits 1. A step that gets no reply
// within STEP_TIMEOUT_MS fails the same way, so a server that never answers cannot hang the suite.
'use strict';

// The longest step waits 1 s for a released job's delay; 10 s is generous on a loaded 2-core box.
const STEP_TIMEOUT_MS = 10000;

function parseArgs(clientName) {
  const [host, port, tube] = process.argv.slice(2);
  if (!host || !port || !tube || !/^\d+$/.test(port)) {
    process.stderr.write(`usage: node ${clientName}.js HOST PORT TUBE\n`);
    process.exit(2);
  }
  return { host, port: Number(port), tube };
}

class CheckFailed extends Error {}

function fail(message) {
  throw new CheckFailed(message);
}

function expectEqual(what, actual, expected) {
  // Stats values arrive as numbers from a YAML parser and as strings from a raw one.
  if (String(actual) !== String(expected)) {
    fail(`${what}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`);
  }
}

function expectFields(what, stats, expected) {
  if (stats === null || typeof stats !== 'object') {
    fail(`${what}: expected a map of stats, got ${JSON.stringify(stats)}`);
  }
  for (const [key, value] of Object.entries(expected)) {
    expectEqual(`${what} ${key}`, stats[key], value);
  }
}

// Runs the checks in order; `run` receives step() and returns when every step passed.
async function runScenario(clientName, server, run) {
  let current = 'connect';
  let count = 0;
  let watchdog = null;
  const step = async (name, body) => {
    current = name;
    clearTimeout(watchdog);
    watchdog = setTimeout(() => {
      process.stderr.write(`FAIL ${current}: no reply from ${server} within ` +
        `${STEP_TIMEOUT_MS / 1000} s\n`);
      process.exit(1);
    }, STEP_TIMEOUT_MS);
    const detail = await body();
    count += 1;
    process.stdout.write(`ok ${name}: ${detail}\n`);
  };
  try {
    await run(step);
  } catch (error) {
    const message = error instanceof CheckFailed ? error.message
      : `unexpected error: ${error && error.stack ? error.stack : error}`;
    process.stderr.write(`FAIL ${current}: ${message}\n`);
    process.exit(1);
  }
  clearTimeout(watchdog);
  process.stdout.write(`PASS ${clientName} against ${server}: ${count} steps\n`);
  process.exit(0);
}

// Expects `promise` to reject with a reply word (fivebeans rejects with the bare word, jackd with
// an Error whose message is the reply line, possibly after "Unexpected response: ").
async function expectReply(what, promise, word) {
  let value;
  try {
    value = await promise;
  } catch (error) {
    const text = String(error && error.message !== undefined ? error.message : error);
    if (text === word || text.endsWith(`: ${word}`)) {
      return word;
    }
    fail(`${what}: expected ${word}, got error ${JSON.stringify(text)}`);
  }
  return fail(`${what}: expected ${word}, got ${JSON.stringify(value)}`);
}

// beanstalkd's YAML is a document of `key: value` lines or of `- item` lines.
function parseFlatYaml(text) {
  const lines = String(text).split('\n').filter((line) => line !== '' && line !== '---');
  if (lines.length > 0 && lines.every((line) => line.startsWith('- '))) {
    return lines.map((line) => line.slice(2));
  }
  const map = {};
  for (const line of lines) {
    const match = /^([^:]+): ?(.*)$/.exec(line);
    if (!match) {
      fail(`cannot parse YAML line ${JSON.stringify(line)} in ${JSON.stringify(text)}`);
    }
    map[match[1]] = match[2];
  }
  return map;
}

module.exports = {
  parseArgs, fail, expectEqual, expectFields, expectReply, runScenario, parseFlatYaml,
};
