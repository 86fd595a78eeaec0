<?php
// The scenario of tests/clients/README.md, driven through Pheanstalk 4 (Debian php-pda-pheanstalk).
// Usage: php pheanstalk.php HOST PORT TUBE
//
// Prints `ok STEP: detail` per checked step and PASS at the end; on the first failure prints
// `FAIL STEP: message` on stderr and exits 1. A step with no reply within STEP_TIMEOUT_S fails too.

declare(strict_types=1);

require_once 'Pheanstalk/autoload.php';

use Pheanstalk\Exception\JobNotFoundException;
use Pheanstalk\Exception\ServerException;
use Pheanstalk\Job;
use Pheanstalk\JobId;
use Pheanstalk\Pheanstalk;

// The longest step waits 1 s for a released job's delay; 10 s is generous on a loaded 2-core box.
const STEP_TIMEOUT_S = 10;

final class CheckFailed extends RuntimeException
{
}

if ($argc !== 4 || !ctype_digit($argv[2])) {
    fwrite(STDERR, "usage: php pheanstalk.php HOST PORT TUBE\n");
    exit(2);
}
[$host, $port, $tube] = [$argv[1], (int) $argv[2], $argv[3]];
$server = "$host:$port";
$currentStep = 'connect';
$stepCount = 0;

// The watchdog: SIGALRM interrupts a blocking read (no syscall restart) and ends the run.
pcntl_async_signals(true);
pcntl_signal(SIGALRM, function () use (&$currentStep, $server): void {
    fwrite(STDERR, "FAIL $currentStep: no reply from $server within " . STEP_TIMEOUT_S . " s\n");
    exit(1);
}, false);

function step(string $name, callable $body): void
{
    global $currentStep, $stepCount;
    $currentStep = $name;
    pcntl_alarm(STEP_TIMEOUT_S);
    $detail = $body();
    $stepCount++;
    echo "ok $name: $detail\n";
}

function fail(string $message): never
{
    throw new CheckFailed($message);
}

function expectEqual(string $what, $actual, $expected): void
{
    // Pheanstalk hands stats values over as strings.
    if ((string) $actual !== (string) $expected) {
        fail("$what: expected " . json_encode($expected) . ', got ' . json_encode($actual));
    }
}

function expectFields(string $what, $stats, array $expected): void
{
    foreach ($expected as $key => $value) {
        expectEqual("$what $key", $stats[$key] ?? null, $value);
    }
}

function expectJob(string $what, ?Job $job, int $id, string $body): string
{
    if ($job === null) {
        fail("$what: expected job $id, got no job (NOT_FOUND or TIMED_OUT)");
    }
    expectEqual("$what id", $job->getId(), $id);
    expectEqual("$what body", $job->getData(), $body);
    return "job {$job->getId()} " . json_encode($job->getData());
}

// Pheanstalk reports NOT_FOUND from peek as JobNotFoundException and from stats-job as a plain
// ServerException "Server reported NOT_FOUND".
function expectNotFound(string $what, callable $call): void
{
    try {
        $value = $call();
    } catch (JobNotFoundException $e) {
        return;
    } catch (ServerException $e) {
        if (str_contains($e->getMessage(), 'NOT_FOUND')) {
            return;
        }
        fail("$what: expected NOT_FOUND, got " . get_class($e) . ': ' . $e->getMessage());
    }
    fail("$what: expected NOT_FOUND, got " . json_encode($value));
}

try {
    $client = Pheanstalk::create($host, $port, STEP_TIMEOUT_S);
    $a = $b = null;

    // useTube/watch/ignore return the client, not the server's count: the server is asked below.
    step('use', function () use ($client, $tube) {
        $client->useTube($tube);
        return "useTube($tube)";
    });
    step('watch', function () use ($client, $tube) {
        $client->watch($tube);
        expectEqual('watched tubes', json_encode($client->listTubesWatched(true)),
            json_encode(['default', $tube]));
        return "watching default and $tube";
    });
    step('ignore', function () use ($client) {
        $client->ignore('default');
        return 'ignore(default)';
    });
    step('watched', function () use ($client, $tube) {
        $watched = $client->listTubesWatched(true);
        expectEqual('list-tubes-watched', json_encode($watched), json_encode([$tube]));
        $used = $client->listTubeUsed(true);
        expectEqual('list-tube-used', $used, $tube);
        return 'watching ' . json_encode($watched) . ", using $used";
    });
    step('put', function () use ($client, &$a, &$b) {
        $a = $client->put('alpha', 100, 0, 30)->getId();
        $b = $client->put('bravo', 200, 30, 30)->getId();
        if ($a === $b) {
            fail("expected two different ids, got $a twice");
        }
        return "A=$a (pri 100), B=$b (pri 200, delay 30)";
    });
    step('peek', fn () => expectJob('peek A', $client->peek(new JobId($a)), $a, 'alpha'));
    step('peek-ready', fn () => expectJob('peek-ready', $client->peekReady(), $a, 'alpha'));
    step('peek-delayed', fn () => expectJob('peek-delayed', $client->peekDelayed(), $b, 'bravo'));
    step('stats-tube', function () use ($client, $tube) {
        expectFields('stats-tube', $client->statsTube($tube), [
            'name' => $tube, 'current-jobs-ready' => 1, 'current-jobs-delayed' => 1,
            'total-jobs' => 2,
        ]);
        return 'ready 1, delayed 1, total-jobs 2';
    });
    step('stats-job-delayed', function () use ($client, $tube, &$b) {
        expectFields('stats-job B', $client->statsJob(new JobId($b)),
            ['state' => 'delayed', 'pri' => 200, 'delay' => 30, 'tube' => $tube]);
        return "B delayed, pri 200, delay 30, tube $tube";
    });
    step('reserve', fn () => expectJob('reserve', $client->reserveWithTimeout(5), $a, 'alpha'));
    step('stats-job', function () use ($client, $tube, &$a) {
        expectFields('stats-job A', $client->statsJob(new JobId($a)), [
            'id' => $a, 'state' => 'reserved', 'pri' => 100, 'ttr' => 30, 'reserves' => 1,
            'tube' => $tube,
        ]);
        return 'A reserved, pri 100, ttr 30, reserves 1';
    });
    step('touch', function () use ($client, &$a) {
        $client->touch(new JobId($a));
        return 'TOUCHED';
    });
    step('kick-job', function () use ($client, &$b) {
        $client->kickJob(new JobId($b));
        expectFields('stats-job B', $client->statsJob(new JobId($b)), ['state' => 'ready']);
        return 'KICKED, B ready';
    });
    step('reserve-second',
        fn () => expectJob('reserve', $client->reserveWithTimeout(5), $b, 'bravo'));
    step('bury', function () use ($client, &$b) {
        $client->bury(new JobId($b), 60);
        expectFields('stats-job B', $client->statsJob(new JobId($b)),
            ['state' => 'buried', 'pri' => 60, 'buries' => 1]);
        return 'BURIED, pri 60, buries 1';
    });
    step('peek-buried', fn () => expectJob('peek-buried', $client->peekBuried(), $b, 'bravo'));
    step('release', function () use ($client, &$a) {
        $client->release(new JobId($a), 50, 1);
        return 'RELEASED with pri 50, delay 1';
    });
    step('reserve-after-delay',
        fn () => expectJob('reserve', $client->reserveWithTimeout(5), $a, 'alpha'));
    step('stats-job-released', function () use ($client, &$a) {
        expectFields('stats-job A', $client->statsJob(new JobId($a)),
            ['state' => 'reserved', 'pri' => 50, 'releases' => 1, 'reserves' => 2]);
        return 'A pri 50, releases 1, reserves 2';
    });
    step('delete', function () use ($client, &$a) {
        $client->delete(new JobId($a));
        expectNotFound('peek deleted A', fn () => $client->peek(new JobId($a)));
        expectNotFound('stats-job deleted A', fn () => $client->statsJob(new JobId($a)));
        return 'DELETED, then NOT_FOUND for peek and stats-job';
    });
    step('kick', function () use ($client, &$b) {
        expectEqual('kick count', $client->kick(10), 1);
        expectFields('stats-job B', $client->statsJob(new JobId($b)),
            ['state' => 'ready', 'kicks' => 2]);
        expectJob('peek-ready', $client->peekReady(), $b, 'bravo');
        return 'KICKED 1, B ready, kicks 2';
    });
    step('pause-tube', function () use ($client, $tube) {
        $client->pauseTube($tube, 30);
        expectFields('stats-tube', $client->statsTube($tube),
            ['pause' => 30, 'current-jobs-ready' => 1]);
        $job = $client->reserveWithTimeout(0);
        if ($job !== null) {
            fail("reserve on a paused tube: expected TIMED_OUT, got job {$job->getId()}");
        }
        return 'PAUSED, pause 30, reserve TIMED_OUT';
    });
    step('unpause', function () use ($client, $tube, &$b) {
        $client->resumeTube($tube);
        expectJob('reserve', $client->reserveWithTimeout(5), $b, 'bravo');
        $client->delete(new JobId($b));
        return 'PAUSED 0 (resumeTube), reserved and deleted B';
    });
    step('list-tubes', function () use ($client, $tube) {
        $tubes = $client->listTubes();
        if (!in_array($tube, $tubes, true)) {
            fail("list-tubes: expected a list containing $tube, got " . json_encode($tubes));
        }
        return count($tubes) . " tubes, $tube among them";
    });
    step('stats-tube-final', function () use ($client, $tube) {
        expectFields('stats-tube', $client->statsTube($tube), [
            'current-jobs-ready' => 0, 'current-jobs-reserved' => 0,
            'current-jobs-delayed' => 0, 'current-jobs-buried' => 0, 'total-jobs' => 2,
            'cmd-delete' => 2, 'cmd-pause-tube' => 2, 'pause' => 0,
        ]);
        return 'empty, total-jobs 2, cmd-delete 2, cmd-pause-tube 2, pause 0';
    });
    step('timed-out', function () use ($client) {
        $job = $client->reserveWithTimeout(0);
        if ($job !== null) {
            fail("reserve-with-timeout 0: expected TIMED_OUT, got job {$job->getId()}");
        }
        return 'TIMED_OUT';
    });
} catch (CheckFailed $e) {
    fwrite(STDERR, "FAIL $currentStep: {$e->getMessage()}\n");
    exit(1);
} catch (Throwable $e) {
    fwrite(STDERR, "FAIL $currentStep: unexpected " . get_class($e) . ": {$e->getMessage()}\n");
    exit(1);
}
pcntl_alarm(0);
echo "PASS pheanstalk against $server: $stepCount steps\n";
exit(0);
