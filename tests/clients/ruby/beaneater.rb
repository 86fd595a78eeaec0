# The scenario of tests/clients/README.md, driven through beaneater (Debian ruby-beaneater).
# Usage: ruby beaneater.rb HOST PORT TUBE
#
# Prints `ok STEP: detail` per checked step and PASS at the end; on the first failure prints
# `FAIL STEP: message` on stderr and exits 1. A step with no reply within STEP_TIMEOUT_S fails too.

require 'beaneater'
require 'json'
require 'timeout'

# The longest step waits 1 s for a released job's delay; 10 s is generous on a loaded 2-core box.
STEP_TIMEOUT_S = 10

class CheckFailed < StandardError; end

unless ARGV.length == 3 && ARGV[1] =~ /\A\d+\z/
  warn 'usage: ruby beaneater.rb HOST PORT TUBE'
  exit 2
end
HOST, PORT, TUBE = ARGV[0], ARGV[1].to_i, ARGV[2]
SERVER = "#{HOST}:#{PORT}"
$current_step = 'connect'
$step_count = 0

def step(name)
  $current_step = name
  detail = Timeout.timeout(STEP_TIMEOUT_S) { yield }
  $step_count += 1
  puts "ok #{name}: #{detail}"
end

def fail!(message)
  raise CheckFailed, message
end

def expect_equal(what, actual, expected)
  # beaneater's YAML parser gives numbers; job ids arrive as strings.
  return if actual.to_s == expected.to_s

  fail!("#{what}: expected #{expected.to_json}, got #{actual.to_json}")
end

def expect_fields(what, stats, expected)
  fail!("#{what}: expected stats, got #{stats.inspect}") if stats.nil?
  expected.each { |key, value| expect_equal("#{what} #{key}", stats[key.to_s.tr('-', '_')], value) }
end

def expect_job(what, job, id, body)
  fail!("#{what}: expected job #{id}, got no job") if job.nil?
  expect_equal("#{what} id", job.id, id)
  expect_equal("#{what} body", job.body, body)
  "job #{job.id} #{job.body.to_json}"
end

# Expects the block to raise the error beaneater maps `word` to (TIMED_OUT -> TimedOutError, ...).
def expect_reply(what, word)
  value = yield
  fail!("#{what}: expected #{word}, got #{value.inspect}")
rescue Beaneater::UnexpectedResponse => e
  return word if e.status == word

  fail!("#{what}: expected #{word}, got #{e.status}")
end

begin
  client = Beaneater.new(SERVER)
  tubes = client.tubes
  tube = tubes[TUBE]
  a = b = nil

  step('use') do
    tubes.use(TUBE)
    "use(#{TUBE})"
  end
  step('watch') do
    tubes.watch(TUBE)
    watched = tubes.watched.map(&:name)
    expect_equal('list-tubes-watched', watched.sort.to_json, ['default', TUBE].sort.to_json)
    "watching #{watched.to_json}"
  end
  step('ignore') do
    tubes.ignore('default')
    "ignore('default')"
  end
  step('watched') do
    watched = tubes.watched.map(&:name)
    expect_equal('list-tubes-watched', watched.to_json, [TUBE].to_json)
    used = tubes.used.name
    expect_equal('list-tube-used', used, TUBE)
    "watching #{watched.to_json}, using #{used}"
  end
  step('put') do
    a = tube.put('alpha', pri: 100, delay: 0, ttr: 30)[:id]
    b = tube.put('bravo', pri: 200, delay: 30, ttr: 30)[:id]
    fail!("expected two different numeric ids, got #{[a, b].inspect}") unless
      a =~ /\A\d+\z/ && b =~ /\A\d+\z/ && a != b
    "A=#{a} (pri 100), B=#{b} (pri 200, delay 30)"
  end
  step('peek') { expect_job('peek A', client.jobs.find(a), a, 'alpha') }
  step('peek-ready') { expect_job('peek-ready', tube.peek(:ready), a, 'alpha') }
  step('peek-delayed') { expect_job('peek-delayed', tube.peek(:delayed), b, 'bravo') }
  step('stats-tube') do
    expect_fields('stats-tube', tube.stats,
                  'name' => TUBE, 'current-jobs-ready' => 1, 'current-jobs-delayed' => 1,
                  'total-jobs' => 2)
    'ready 1, delayed 1, total-jobs 2'
  end
  step('stats-job-delayed') do
    expect_fields('stats-job B', client.jobs.find(b).stats,
                  'state' => 'delayed', 'pri' => 200, 'delay' => 30, 'tube' => TUBE)
    "B delayed, pri 200, delay 30, tube #{TUBE}"
  end
  job_a = nil
  step('reserve') do
    job_a = tubes.reserve(5)
    expect_job('reserve', job_a, a, 'alpha')
  end
  step('stats-job') do
    expect_fields('stats-job A', job_a.stats, 'id' => a, 'state' => 'reserved', 'pri' => 100,
                                              'ttr' => 30, 'reserves' => 1, 'tube' => TUBE)
    'A reserved, pri 100, ttr 30, reserves 1'
  end
  step('touch') do
    job_a.touch
    'TOUCHED'
  end
  step('kick-job') do
    client.jobs.find(b).kick
    expect_fields('stats-job B', client.jobs.find(b).stats, 'state' => 'ready')
    'KICKED, B ready'
  end
  job_b = nil
  step('reserve-second') do
    job_b = tubes.reserve(5)
    expect_job('reserve', job_b, b, 'bravo')
  end
  step('bury') do
    # With pri: given, beaneater sends bury directly (without it, it asks stats-job first).
    job_b.bury(pri: 60)
    expect_fields('stats-job B', job_b.stats, 'state' => 'buried', 'pri' => 60, 'buries' => 1)
    'BURIED, pri 60, buries 1'
  end
  step('peek-buried') { expect_job('peek-buried', tube.peek(:buried), b, 'bravo') }
  step('release') do
    job_a.release(pri: 50, delay: 1)
    'RELEASED with pri 50, delay 1'
  end
  step('reserve-after-delay') do
    job_a = tubes.reserve(5)
    expect_job('reserve', job_a, a, 'alpha')
  end
  step('stats-job-released') do
    expect_fields('stats-job A', job_a.stats,
                  'state' => 'reserved', 'pri' => 50, 'releases' => 1, 'reserves' => 2)
    'A pri 50, releases 1, reserves 2'
  end
  step('delete') do
    job_a.delete
    # jobs.find turns NOT_FOUND into nil; the raw command shows the reply word itself.
    found = client.jobs.find(a)
    fail!("peek deleted A: expected NOT_FOUND, got #{found.inspect}") unless found.nil?
    expect_reply('stats-job deleted A', 'NOT_FOUND') { job_a.stats }
    'DELETED, then NOT_FOUND for peek and stats-job'
  end
  step('kick') do
    reply = tube.kick(10)
    # beaneater reports the count of a KICKED reply under :id.
    expect_equal('kick count', reply[:id], 1)
    expect_fields('stats-job B', job_b.stats, 'state' => 'ready', 'kicks' => 2)
    expect_job('peek-ready', tube.peek(:ready), b, 'bravo')
    'KICKED 1, B ready, kicks 2'
  end
  step('pause-tube') do
    tube.pause(30)
    expect_fields('stats-tube', tube.stats, 'pause' => 30, 'current-jobs-ready' => 1)
    expect_reply('reserve on a paused tube', 'TIMED_OUT') { tubes.reserve(0) }
    'PAUSED, pause 30, reserve TIMED_OUT'
  end
  step('unpause') do
    tube.pause(0)
    job_b = tubes.reserve(5)
    expect_job('reserve', job_b, b, 'bravo')
    job_b.delete
    'PAUSED 0, reserved and deleted B'
  end
  step('list-tubes') do
    names = tubes.all.map(&:name)
    fail!("list-tubes: expected a list containing #{TUBE}, got #{names.to_json}") unless
      names.include?(TUBE)
    "#{names.length} tubes, #{TUBE} among them"
  end
  step('stats-tube-final') do
    expect_fields('stats-tube', tube.stats,
                  'current-jobs-ready' => 0, 'current-jobs-reserved' => 0,
                  'current-jobs-delayed' => 0, 'current-jobs-buried' => 0, 'total-jobs' => 2,
                  'cmd-delete' => 2, 'cmd-pause-tube' => 2, 'pause' => 0)
    'empty, total-jobs 2, cmd-delete 2, cmd-pause-tube 2, pause 0'
  end
  step('timed-out') do
    expect_reply('reserve-with-timeout 0', 'TIMED_OUT') { tubes.reserve(0) }
    'TIMED_OUT'
  end
  client.close
rescue CheckFailed => e
  warn "FAIL #{$current_step}: #{e.message}"
  exit 1
rescue Timeout::Error
  warn "FAIL #{$current_step}: no reply from #{SERVER} within #{STEP_TIMEOUT_S} s"
  exit 1
rescue StandardError => e
  warn "FAIL #{$current_step}: unexpected #{e.class}: #{e.message}"
  exit 1
end
puts "PASS beaneater against #{SERVER}: #{$step_count} steps"
